"""What the bank workload checks at its end, apart from the cluster: each transfer as the client was
told it ended, against what storage holds (read directly, no node in between: a node answers a
committed value from its write-through cache, which a loss in storage does not reach) and, for a
transfer whose outcome the client never learned, against what the status call answers. Pure
functions over plain data, so tests/cluster/test_bank.py can show each check failing on a crafted
bad state without a cluster."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cornus.runtime.keys import partition_names, partition_of
from storage_adapters.contract import DATA_BATCH_COUNT_MAX, LogId, TxnState
from storage_adapters.factory import StoreConfig, open_store

MARKER_VALUE = "done"

# What a client was told of one transfer.
COMMITTED = "committed"  # commit answered 200, outcome committed
ABORTED = "aborted"  # commit answered 409, outcome aborted
NOTHING_RAN = "nothing-ran"  # commit answered 503: the node did no work, nothing committed
UNKNOWN = "unknown"  # 202, a timeout, a broken connection, or any other answer to the commit
FAILED = "failed"  # never sent commit (begin, read or write failed): can never commit
TOLD = (COMMITTED, ABORTED, NOTHING_RAN, UNKNOWN, FAILED)
# Markers these must not leave in storage.
NEVER_COMMITTED = (ABORTED, NOTHING_RAN, FAILED)

# What the status call answered for a transfer told unknown, once nothing is in flight.
STATUS_COMMITTED = "committed"
STATUS_ABORTED = "aborted"
STATUS_NOT_FOUND = "not-found"  # 404: no participant holds a record of it and no node remembers it
DEFINITIVE = (STATUS_COMMITTED, STATUS_ABORTED, STATUS_NOT_FOUND)

# What a transfer told unknown left in storage's logs (every partition's and every coordinator's).
RECORDS_COMMIT = "COMMIT"
RECORDS_ABORT = "ABORT"
RECORDS_IN_DOUBT = "VOTE_YES only"
# No record anywhere: it never voted. A decided transaction keeps a record, or the decision's
# tombstone, for gc_grace_ms + outcome_keep_ms (12 s + 600 s by default) after its decision, far
# longer than a bank run: none left means it never committed.
RECORDS_NONE = "none"


def records_verdict(states: Iterable[str]) -> str:
    """What the states of one transaction's records in every log say of its outcome."""
    found = set(states)
    if TxnState.COMMIT in found and TxnState.ABORT in found:
        return f"contradictory records {sorted(found)}"
    if TxnState.COMMIT in found:
        return RECORDS_COMMIT
    if TxnState.ABORT in found:
        return RECORDS_ABORT
    return RECORDS_IN_DOUBT if found else RECORDS_NONE


@dataclass(frozen=True)
class Transfer:
    """One transfer, as its client saw it."""

    marker: str  # a key only this transfer writes (MARKER_VALUE)
    txn: str | None  # None when begin never answered
    told: str  # one of TOLD
    node: str = ""
    protocol: str | None = None
    detail: str = ""  # what the commit answered, when that is not plain

    def __post_init__(self) -> None:
        assert self.told in TOLD, self.told


def check_storage_matches_api(
    api: Mapping[str, str | None], stored: Mapping[str, bytes | None]
) -> list[str]:
    """Every key the nodes answered (accounts and markers): storage holds the same value."""
    problems = []
    for key, value in api.items():
        expected = None if value is None else value.encode()
        if key not in stored:
            problems.append(f"{key}: not read from storage")
        elif stored[key] != expected:
            problems.append(f"{key}: nodes answer {value!r}, storage holds {stored[key]!r}")
    return problems


def stored_total(stored: Mapping[str, bytes | None], accounts: Iterable[str]) -> int:
    missing = [account for account in accounts if stored.get(account) is None]
    assert not missing, f"accounts missing in storage: {missing}"
    return sum(int(stored[account]) for account in accounts)  # type: ignore[arg-type]


def check_transfers(
    transfers: Iterable[Transfer], stored: Mapping[str, bytes | None], statuses: Mapping[str, str],
    records: Mapping[str, str] | None = None,
) -> list[str]:
    """Each transfer's marker in storage against what its client was told: committed => present;
    aborted, nothing ran, never sent commit => absent; unknown => present iff it committed, by the
    status call (`statuses`: txn -> STATUS_*, or what it answered when it could not tell) and by
    its records in storage (`records`: txn -> records_verdict); the two must agree where both tell,
    and where neither tells once nothing is in flight, that is a problem too."""
    records = records or {}
    problems = []
    for transfer in transfers:
        value = stored.get(transfer.marker)
        if value not in (None, MARKER_VALUE.encode()):
            problems.append(f"{transfer}: marker holds {value!r}")
            continue
        present = value is not None
        where = f"{transfer.marker} (txn {transfer.txn}, told {transfer.told}, node {transfer.node}, " \
                f"protocol {transfer.protocol}{', ' + transfer.detail if transfer.detail else ''})"
        if transfer.told == COMMITTED and not present:
            problems.append(f"{where}: told committed, marker absent in storage")
        elif transfer.told in NEVER_COMMITTED and present:
            problems.append(f"{where}: told it never committed, marker present in storage")
        elif transfer.told == UNKNOWN:
            status = statuses.get(transfer.txn) if transfer.txn is not None else None
            verdict = records.get(transfer.txn) if transfer.txn is not None else None
            said = f"status {status}, records {verdict}, marker {'present' if present else 'absent'}"
            by_status = None if status not in DEFINITIVE else status == STATUS_COMMITTED
            by_records = {RECORDS_COMMIT: True, RECORDS_ABORT: False, RECORDS_NONE: False}.get(verdict or "")
            if by_status is not None and by_records is not None and by_status != by_records:
                problems.append(f"{where}: the status call and the records disagree: {said}")
            elif by_status is None and by_records is None:
                problems.append(f"{where}: unresolved after the run: {said}")
            elif (by_status if by_status is not None else by_records) != present:
                problems.append(f"{where}: marker contradicts the outcome: {said}")
    return problems


def read_records(
    storage: Mapping[str, str], txns: Iterable[str], partition_count: int, node_ids: Iterable[str]
) -> dict[str, str]:
    """records_verdict of each of `txns`, from its records in every partition's and every
    coordinator's log, read straight from storage."""
    config = StoreConfig(**{k: (int(v) if k == "timeout_ms_call" else v) for k, v in storage.items()})
    logs = [*(LogId.partition(p) for p in partition_names(partition_count)), *(LogId.coordinator(n) for n in node_ids)]

    async def read() -> dict[str, str]:
        store = await open_store(config)
        try:
            verdicts = {}
            for txn in txns:
                found = [await store.read(log, txn) for log in logs]
                verdicts[txn] = records_verdict(record.state for record in found if record is not None)
            return verdicts
        finally:
            await store.close()

    return asyncio.run(read())


def read_stored(storage: Mapping[str, str], keys: Iterable[str], partition_count: int) -> dict[str, bytes | None]:
    """The values storage holds for `keys`, read with the nodes' own storage settings."""
    by_partition: dict[str, list[str]] = defaultdict(list)
    for key in dict.fromkeys(keys):
        by_partition[partition_of(key, partition_count)].append(key)
    config = StoreConfig(**{k: (int(v) if k == "timeout_ms_call" else v) for k, v in storage.items()})

    async def read() -> dict[str, bytes | None]:
        store = await open_store(config)
        try:
            values: dict[str, bytes | None] = {}
            for partition, wanted in by_partition.items():
                for start in range(0, len(wanted), DATA_BATCH_COUNT_MAX):
                    values.update(await store.read_data(partition, wanted[start : start + DATA_BATCH_COUNT_MAX]))
            return values
        finally:
            await store.close()

    return asyncio.run(read())
