"""Hypothesis property tests of the LogStore contract on the emulator: random sequences of calls
against a plain-Python model of the contract; after every step every record, the unfinished scan
and the data must equal the model."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from storage_adapters.contract import LogId, LogKind, RecordBody, TxnState
from storage_adapters.emulator import EmulatorStore
from storage_adapters.errors import DecisionFlipRefused, InvariantViolation

PARTITIONS = ("p0", "p1")
LOGS = (LogId.partition("p0"), LogId.partition("p1"), LogId.coordinator("p0"))
TXNS = ("t0", "t1", "t2")
KEYS = ("k0", "k1", "k2")

bodies = st.builds(
    RecordBody,
    participants=st.lists(st.sampled_from(PARTITIONS), unique=True).map(tuple),
    coordinator=st.sampled_from(["", "n0", "n1"]),
    redo=st.binary(max_size=16),
)
writes_strategy = st.dictionaries(st.sampled_from(KEYS), st.none() | st.binary(max_size=8), max_size=3)


class _Shared:
    """One store, and its event loop, for every example of a run: opening one starts the emulator's
    writer process (about 0.15 s of CPU, and the suite is CPU-bound), which 60 examples did 60
    times. Each example works in partitions and logs of its own instead (`examples` numbers
    them), so none sees another's records or data."""

    loop: asyncio.AbstractEventLoop | None = None
    directory: tempfile.TemporaryDirectory[str] | None = None
    store: EmulatorStore | None = None
    examples = 0

    @classmethod
    def open(cls) -> tuple[asyncio.AbstractEventLoop, EmulatorStore]:
        if cls.store is None:
            cls.loop = asyncio.new_event_loop()
            cls.directory = tempfile.TemporaryDirectory()
            cls.store = cls.loop.run_until_complete(EmulatorStore.open(Path(cls.directory.name) / "model.db"))
        assert cls.loop is not None
        return cls.loop, cls.store

    @classmethod
    def close(cls) -> None:
        if cls.store is not None and cls.loop is not None and cls.directory is not None:
            cls.loop.run_until_complete(cls.store.close())
            cls.loop.close()
            cls.directory.cleanup()
        cls.loop, cls.directory, cls.store = None, None, None


class _ExampleStore:
    """The shared store, seen through one example's own names: the model speaks of LOGS and
    PARTITIONS, and each call goes to this example's copy of them."""

    def __init__(self, store: EmulatorStore, prefix: str) -> None:
        self._store = store
        self._prefix = prefix

    def _log(self, log: LogId) -> LogId:
        own = f"{self._prefix}{log.name}"
        return LogId.partition(own) if log.kind is LogKind.PARTITION else LogId.coordinator(own)

    def log_once(self, log: LogId, txn: str, state: TxnState, body: RecordBody) -> Any:
        return self._store.log_once(self._log(log), txn, state, body)

    def log(self, log: LogId, txn: str, state: TxnState, body: RecordBody | None) -> Any:
        return self._store.log(self._log(log), txn, state, body)

    def apply_redo(self, partition: str, txn: str, writes: dict[str, bytes | None]) -> Any:
        return self._store.apply_redo(f"{self._prefix}{partition}", txn, writes)

    def delete(self, log: LogId, txn: str) -> Any:
        return self._store.delete(self._log(log), txn)

    def read(self, log: LogId, txn: str) -> Any:
        return self._store.read(self._log(log), txn)

    def scan_unfinished(self, log: LogId) -> Any:
        return self._store.scan_unfinished(self._log(log))

    def read_data(self, partition: str, keys: list[str]) -> Any:
        return self._store.read_data(f"{self._prefix}{partition}", keys)


class LogStoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop, shared = _Shared.open()
        _Shared.examples += 1
        self.store = _ExampleStore(shared, f"x{_Shared.examples}-")
        self.records: dict[tuple[LogId, str], dict[str, Any]] = {}
        self.data: dict[tuple[str, str], bytes] = {}

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    @rule(log=st.sampled_from(LOGS), txn=st.sampled_from(TXNS), state=st.sampled_from(TxnState), body=bodies)
    def log_once(self, log: LogId, txn: str, state: TxnState, body: RecordBody) -> None:
        result = self.run(self.store.log_once(log, txn, state, body))
        stored = self.records.get((log, txn))
        if stored is None:
            assert result.created and result.state is state
            self.records[(log, txn)] = {"state": state, "body": body, "applied": False}
        else:
            assert not result.created and result.state is stored["state"]

    @rule(
        log=st.sampled_from(LOGS),
        txn=st.sampled_from(TXNS),
        state=st.sampled_from(TxnState),
        body=st.none() | bodies,
    )
    def log(self, log: LogId, txn: str, state: TxnState, body: RecordBody | None) -> None:
        stored = self.records.get((log, txn))
        if stored is not None and stored["state"] is not TxnState.VOTE_YES and stored["state"] is not state:
            try:
                self.run(self.store.log(log, txn, state, body))
            except DecisionFlipRefused as refused:
                assert refused.stored is stored["state"]
                return
            raise AssertionError("flip accepted")
        assert self.run(self.store.log(log, txn, state, body)) is state
        if stored is None:
            self.records[(log, txn)] = {"state": state, "body": body or RecordBody(), "applied": False}
        else:
            stored["state"] = state
            if body is not None:
                stored["body"] = body

    @rule(partition=st.sampled_from(PARTITIONS), txn=st.sampled_from(TXNS), writes=writes_strategy)
    def apply_redo(self, partition: str, txn: str, writes: dict[str, bytes | None]) -> None:
        stored = self.records.get((LogId.partition(partition), txn))
        if stored is None or stored["state"] is TxnState.ABORT:
            try:
                self.run(self.store.apply_redo(partition, txn, writes))
            except InvariantViolation:
                return
            raise AssertionError("apply_redo accepted a record that is neither VOTE_YES nor COMMIT")
        applied_now = self.run(self.store.apply_redo(partition, txn, writes))
        assert applied_now is not stored["applied"]
        if stored["applied"]:
            return  # a repeated apply writes nothing
        # A vote is committed by the apply itself, in the same step as the data.
        stored["state"] = TxnState.COMMIT
        stored["applied"] = True
        for key, value in writes.items():
            if value is None:
                self.data.pop((partition, key), None)
            else:
                self.data[(partition, key)] = value

    @rule(log=st.sampled_from(LOGS), txn=st.sampled_from(TXNS))
    def delete(self, log: LogId, txn: str) -> None:
        assert self.run(self.store.delete(log, txn)) is ((log, txn) in self.records)
        self.records.pop((log, txn), None)

    @invariant()
    def storage_equals_model(self) -> None:
        for log in LOGS:
            for txn in TXNS:
                record = self.run(self.store.read(log, txn))
                expected = self.records.get((log, txn))
                if expected is None:
                    assert record is None
                else:
                    assert record is not None
                    assert (record.state, record.body, record.applied) == (
                        expected["state"], expected["body"], expected["applied"]
                    )
            unfinished = {record.txn for record in self.run(self.store.scan_unfinished(log))}
            assert unfinished == {
                txn
                for (model_log, txn), rec in self.records.items()
                if model_log == log
                and (rec["state"] is TxnState.VOTE_YES or (rec["state"] is TxnState.COMMIT and not rec["applied"]))
            }
        for partition in PARTITIONS:
            found = self.run(self.store.read_data(partition, list(KEYS)))
            assert found == {key: self.data.get((partition, key)) for key in KEYS}


LogStoreModel.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


class TestLogStoreContract(LogStoreModel.TestCase):  # type: ignore[name-defined,misc]
    @classmethod
    def tearDownClass(cls) -> None:
        _Shared.close()
        super().tearDownClass()
