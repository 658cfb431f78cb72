"""Cornus termination: LogOnce(ABORT) on other participants' logs until the outcome is known.

Any ABORT -> ABORT; any COMMIT -> COMMIT; VOTE_YES everywhere -> COMMIT. Logs that storage could
not reach are retried after a capped, jittered backoff, forever: the transaction is in doubt, not
lost, and deciding without an answer from every log could contradict a COMMIT already returned.
"""

from __future__ import annotations

from cornus.protocol.backoff import Backoff
from cornus.protocol.effects import Effect, LogOnce, StartTimer
from cornus.protocol.events import StorageUnreachable
from storage_adapters.contract import LogId, LogOnceResult, RecordBody, TxnState


class Termination:
    """One participant's (or the coordinator's) termination of one transaction."""

    __slots__ = ("_backoff", "_body", "_logs_unknown", "_logs_waiting", "outcome", "timer_name", "txn")

    def __init__(
        self,
        txn: str,
        logs: tuple[LogId, ...],
        body: RecordBody,
        backoff: Backoff,
        timer_name: str,
    ) -> None:
        assert len(set(logs)) == len(logs), "a log must not be asked twice in one round"
        self.txn = txn
        self.timer_name = timer_name
        self._body = body
        self._backoff = backoff
        # Logs whose state we have not learned yet, and of those the ones with a call in flight.
        self._logs_unknown: set[LogId] = set(logs)
        self._logs_waiting: set[LogId] = set()
        self.outcome: TxnState | None = None if logs else TxnState.COMMIT

    @property
    def in_doubt(self) -> bool:
        return self.outcome is None

    def start(self) -> list[Effect]:
        return self._ask(sorted(self._logs_unknown, key=lambda log: log.key))

    def on_result(self, call: LogOnce, result: LogOnceResult | StorageUnreachable) -> list[Effect]:
        """Feed back the answer to one of our calls; returns the follow-up effects."""
        assert call.state is TxnState.ABORT and call.txn == self.txn
        if self.outcome is not None:
            return []
        assert call.log in self._logs_waiting, f"unexpected termination answer from {call.log.key}"
        self._logs_waiting.discard(call.log)
        if isinstance(result, StorageUnreachable):
            if not self._logs_waiting:
                return [StartTimer(self.timer_name, self._backoff.next_delay_ms())]
            return []
        if result.state is TxnState.VOTE_YES:
            self._logs_unknown.discard(call.log)
            if not self._logs_unknown:
                self.outcome = TxnState.COMMIT
        else:
            self._logs_unknown.clear()
            self.outcome = result.state
        if self.outcome is None and not self._logs_waiting:
            # Some log was unreachable earlier in this round and its retry is due after backoff.
            return [StartTimer(self.timer_name, self._backoff.next_delay_ms())]
        return []

    def on_timer(self) -> list[Effect]:
        if self.outcome is not None:
            return []
        return self._ask(sorted(self._logs_unknown - self._logs_waiting, key=lambda log: log.key))

    def _ask(self, logs: list[LogId]) -> list[Effect]:
        self._logs_waiting.update(logs)
        return [LogOnce(log, self.txn, TxnState.ABORT, self._body) for log in logs]
