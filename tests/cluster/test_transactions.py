"""Transactions end to end on a real 3-node cluster, for every protocol and two backends."""

from __future__ import annotations

import pytest

from tests.cluster.harness import keys_on, running_cluster

PROTOCOLS = ["cornus", "2pc", "coordinator-log"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_multi_partition_commit_abort_and_conflict(protocol: str, storage: dict[str, str]) -> None:
    with running_cluster(protocol, storage) as cluster:
        cluster.start_all()
        # Keys on every partition, so every node is a participant.
        keys = [keys_on(f"p{i}", 6, 1, prefix="a")[0] for i in range(6)]
        response = cluster.execute("n0", [{"op": "put", "key": k, "value": f"v-{k}"} for k in keys])
        assert response.status_code == 200 and response.json()["outcome"] == "committed", response.text
        assert cluster.read("n1", keys) == {k: f"v-{k}" for k in keys}

        # Interactive: read, write, commit; then abort leaves nothing behind.
        txn = cluster.post("n2", "/v1/txn").json()["txn"]
        assert cluster.post("n2", f"/v1/txn/{txn}/read", {"keys": keys[:2]}).json()["values"] == {
            keys[0]: f"v-{keys[0]}", keys[1]: f"v-{keys[1]}"
        }
        assert cluster.post("n2", f"/v1/txn/{txn}/write", {"writes": {keys[0]: "x", keys[1]: None}}).status_code == 200
        committed = cluster.post("n2", f"/v1/txn/{txn}/commit")
        assert committed.status_code == 200 and committed.json()["outcome"] == "committed"
        assert cluster.read("n0", keys[:2]) == {keys[0]: "x", keys[1]: None}
        assert cluster.get("n1", f"/v1/txn/{txn}").json()["outcome"] == "committed"

        txn = cluster.post("n1", "/v1/txn").json()["txn"]
        cluster.post("n1", f"/v1/txn/{txn}/write", {"writes": {keys[2]: "never"}})
        aborted = cluster.post("n1", f"/v1/txn/{txn}/abort")
        assert aborted.status_code == 409 and aborted.json()["reason"] == "client"
        assert cluster.post("n1", f"/v1/txn/{txn}/commit").status_code == 409  # wrong state
        assert cluster.read("n2", [keys[2]]) == {keys[2]: f"v-{keys[2]}"}

        # Conflict: a second writer of a locked key aborts with a retryable reason (NO_WAIT).
        first = cluster.post("n0", "/v1/txn").json()["txn"]
        assert cluster.post("n0", f"/v1/txn/{first}/write", {"writes": {keys[3]: "first"}}).status_code == 200
        second = cluster.execute("n1", [{"op": "put", "key": keys[3], "value": "second"}])
        assert second.status_code == 409, second.text
        assert second.json()["reason"] == "conflict" and second.json()["retryable"] is True
        assert cluster.post("n0", f"/v1/txn/{first}/commit").json()["outcome"] == "committed"
        assert cluster.read("n2", [keys[3]]) == {keys[3]: "first"}

        # A failed check aborts the whole transaction and writes nothing.
        checked = cluster.execute("n2", [{"op": "put", "key": keys[4], "value": "no"},
                                         {"op": "check", "key": keys[5], "value": "wrong"}])
        assert checked.status_code == 409 and checked.json()["reason"] == "check_failed"
        assert checked.json()["retryable"] is False
        assert cluster.read("n0", [keys[4]]) == {keys[4]: f"v-{keys[4]}"}


def test_reads_too_large_for_the_peer_link_are_refused_as_input_not_retried(tmp_path, services) -> None:
    """Found by audit (2026-11-27): the owner of a remote partition ran a read whose values passed
    the peer link's message size (16 MiB; 300 values of 65,000 bytes are 19.5 MB), and the link failed its
    answer as "not answered", which the coordinator reported as retryable: a client retried it
    forever, and a one-shot that also wrote ended UNKNOWN. The owner now refuses such a read before
    it votes, as the client's input (400, not retryable), locally and remotely alike."""
    from tests.cluster.conftest import storage_for

    with running_cluster("cornus", storage_for("emulator", services, tmp_path), node_count=2,
                         partition_count=2) as cluster:
        cluster.start_all()
        keys = keys_on("p1", 2, 300, prefix="big")
        value = "v" * 65_000
        owner = cluster.owner("p1")
        other = next(n for n in cluster.nodes if n != owner)
        for start in range(0, len(keys), 2):  # two a transaction: a partition's redo holds 128 KiB
            put = cluster.execute(owner, [{"op": "put", "key": k, "value": value} for k in keys[start:start + 2]])
            assert put.status_code == 200 and put.json()["outcome"] == "committed", put.text[:500]
        reads = [{"op": "get", "key": k} for k in keys]
        here = keys_on("p0", 2, 1, prefix="small")[0]
        for node_id in (other, owner):  # remote, then local: the same answer
            for ops in (reads, [*reads, {"op": "put", "key": here, "value": "w"}]):
                refused = cluster.execute(node_id, ops)
                assert refused.status_code == 400, (node_id, refused.status_code, refused.text[:500])
                assert refused.json()["error"] == "invalid_request" and "read fewer keys" in refused.json()["detail"]
        assert cluster.read(other, [here]) == {here: None}, "a write of a refused transaction landed"
        # An interactive read is refused the same way and its transaction goes on, whether the
        # refused read was its first on the partition (withdrawn there) or a later one.
        for first in ([], keys[:1]):
            txn = cluster.post(other, "/v1/txn").json()["txn"]
            if first:
                assert cluster.post(other, f"/v1/txn/{txn}/read", {"keys": first}).status_code == 200
            refused = cluster.post(other, f"/v1/txn/{txn}/read", {"keys": keys})
            assert refused.status_code == 400 and "read fewer keys" in refused.json()["detail"], refused.text[:500]
            read = cluster.post(other, f"/v1/txn/{txn}/read", {"keys": keys[:2]})
            assert read.status_code == 200 and read.json()["values"] == dict.fromkeys(keys[:2], value), read.text[:300]
            assert cluster.post(other, f"/v1/txn/{txn}/write", {"writes": {keys[-1]: "w"}}).status_code == 200
            committed = cluster.post(other, f"/v1/txn/{txn}/commit")
            assert committed.json()["outcome"] == "committed", committed.text
            assert cluster.read(owner, keys[-1:]) == {keys[-1]: "w"}
        # Within the limit, the same values read fine from the remote owner.
        assert cluster.read(other, keys[:100]) == dict.fromkeys(keys[:100], value)
