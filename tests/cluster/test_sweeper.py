"""The sweeper on real node processes over real storage (docs/sweeper-design.md, step 7): what a
coordinator killed within its grace leaves behind, which no later process of it would ever
collect, is collected by the partitions' holders once it is old enough, and its outcome is still
told."""

from __future__ import annotations

import asyncio
import re
import time

from storage_adapters.contract import LogId, RecordBody, TxnState
from tests.cluster.harness import keys_on, opened_store, read_records, running_cluster

# A storage deadline of 1 s, the smallest grace it allows, and a termination bound of 2 s: the
# age a sweeper waits (sweeper.sweep_age_ms_min) comes to about 7.7 s with these.
SETTINGS = {
    "gc_grace_ms": 2_500,
    "outcome_keep_ms": 60_000,
    "coordinator_terminate_ms_max": 2_000,
    "sweep_interval_ms": 1_000,
}
STORAGE_TIMEOUT_MS = "1000"
# The age, a pass's interval with its jitter, and room for a loaded machine.
SWEPT_WAIT_S = 40.0
_SWEPT = re.compile(r'^cornus_sweeper_events_total\{event="swept"\} (\S+)$', re.MULTILINE)
_BACKLOG = re.compile(r"^cornus_sweeper_backlog_records (\S+)$", re.MULTILINE)


async def _finished(storage: dict[str, str], partition: str) -> list[str]:
    async with opened_store(storage) as store:
        page = await store.scan_finished_page(LogId.partition(partition))
        return [record.txn for record in page.records]


def test_a_coordinator_killed_within_its_grace_leaves_records_the_sweepers_collect(storage: dict[str, str]) -> None:
    """Found by review (2026-11-28): only a transaction's coordinator collects its records, a
    grace after its decision; killed within it and not restarted (or restarted: no later process
    knows a Cornus transaction its earlier one coordinated), it leaves them in storage for ever.
    With sweeping on, the holders of its partitions put a tombstone over each once it is older
    than the sweep age, and the status call still says committed."""
    storage = {**storage, "timeout_ms_call": STORAGE_TIMEOUT_MS}
    with running_cluster("cornus", storage, settings=SETTINGS) as cluster:
        cluster.start_all({"n0": "coordinator.after_reply"})
        # p1 (n1) and p2 (n2) take part; n0 coordinates, and dies once it has answered.
        keys = [keys_on("p1", 6, 1)[0], keys_on("p2", 6, 1)[0]]
        response = cluster.execute("n0", [{"op": "put", "key": k, "value": "v"} for k in keys])
        assert response.status_code == 200, response.text
        txn = response.json()["txn"]
        assert cluster.wait_exit("n0") == -9, "the failpoint must have killed the coordinator"
        left = asyncio.run(read_records(storage, txn, ["p1", "p2"]))
        assert all(record is not None and record.body != RecordBody() for record in left.values()), (
            f"collected before the kill: {left}")
        deadline = time.monotonic() + SWEPT_WAIT_S
        while True:
            records = asyncio.run(read_records(storage, txn, ["p1", "p2"]))
            if all(record is not None and record.body == RecordBody() for record in records.values()):
                break
            assert time.monotonic() < deadline, f"{txn} was never swept: {records}"
            time.sleep(0.5)
        for partition, record in records.items():
            assert record is not None and (record.state, record.applied) == (TxnState.COMMIT, True), (partition, record)
            assert txn not in asyncio.run(_finished(storage, partition)), "a tombstone is listed as finished"
        for node in ("n1", "n2"):
            status = cluster.get(node, f"/v1/txn/{txn}")
            assert status.status_code == 200 and status.json()["outcome"] == "committed", (node, status.text)
        metrics = [cluster.get(node, "/metrics").text for node in ("n1", "n2")]
        swept = sum(float(match) for text in metrics for match in _SWEPT.findall(text))
        assert swept >= 2, f"the sweepers' metrics count {swept} swept"
        # Nothing old is left behind on the holders: the passes that swept the records count none.
        backlogs = [_BACKLOG.findall(text) for text in metrics]
        assert backlogs == [["0.0"], ["0.0"]], backlogs
