"""Cornus termination: LogOnce(ABORT) on participants' logs until the outcome is known.

The rule, owned here and nowhere else: any ABORT -> ABORT; any COMMIT -> COMMIT; VOTE_YES in every
participant's log -> COMMIT. Logs that storage could not reach are asked again after a capped,
jittered backoff, forever: the transaction is in doubt, not lost, and deciding without an answer
from every log could contradict a COMMIT already returned.
"""

from __future__ import annotations

from collections.abc import Iterable

from cornus.protocol.backoff import Backoff
from cornus.protocol.effects import Effect, LogOnce, StartTimer, Timer
from cornus.protocol.events import StorageUnreachable
from storage_adapters.contract import LogId, LogOnceResult, RecordBody, TxnState


def decision_among(states: Iterable[TxnState]) -> TxnState | None:
    """The decision some log already holds, if any. Two different decisions in one transaction's
    logs would mean the protocol broke: crash rather than pick one."""
    decided = {state for state in states if state.is_decision}
    assert len(decided) <= 1, f"both COMMIT and ABORT are logged: {sorted(decided)}"
    return next(iter(decided), None)


class Termination:
    """One participant's (or the coordinator's, or a manual resolve's) termination of one txn."""

    __slots__ = ("_backoff", "_body", "_logs_unknown", "_logs_waiting", "outcome", "owner", "timer", "txn")

    def __init__(
        self,
        owner: str,
        txn: str,
        logs: tuple[LogId, ...],
        body: RecordBody,
        *,
        backoff: Backoff,
        timer: Timer,
    ) -> None:
        assert len(set(logs)) == len(logs), "a log must not be asked twice in one round"
        self.owner = owner
        self.txn = txn
        self.timer = timer
        self._body = body
        self._backoff = backoff
        # Logs whose state we have not learned yet, and of those the ones with a call in flight.
        self._logs_unknown: set[LogId] = set(logs)
        self._logs_waiting: set[LogId] = set()
        self.outcome: TxnState | None = None if logs else TxnState.COMMIT

    @property
    def in_doubt(self) -> bool:
        return self.outcome is None

    @property
    def waiting(self) -> bool:
        """Some call of the current round is still unanswered."""
        return bool(self._logs_waiting)

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
                return [StartTimer(self.timer, self._backoff.next_delay_ms())]
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
            return [StartTimer(self.timer, self._backoff.next_delay_ms())]
        return []

    def on_timer(self) -> list[Effect]:
        if self.outcome is not None:
            return []
        return self._ask(sorted(self._logs_unknown - self._logs_waiting, key=lambda log: log.key))

    def _ask(self, logs: list[LogId]) -> list[Effect]:
        self._logs_waiting.update(logs)
        return [LogOnce(self.owner, log, self.txn, TxnState.ABORT, self._body) for log in logs]
