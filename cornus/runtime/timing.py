"""The commit-path timing breakdown of each transaction (execution, prepare, commit, reply), kept
for the most recent transactions so benchmarks and metrics can read where time goes."""

from __future__ import annotations

import collections
import statistics
import time
from dataclasses import dataclass, field

# Breakdowns kept for reading back; older ones are dropped.
TIMING_COUNT_MAX = 20_000


@dataclass(slots=True)
class TxnTiming:
    protocol: str
    began: float = field(default_factory=time.perf_counter)
    commit_requested: float = 0.0
    decided: float = 0.0  # votes in (or termination done): the outcome is known
    replied: float = 0.0
    participant_count: int = 0

    def phases_ms(self) -> dict[str, float]:
        """execution: begin -> commit asked; prepare: -> outcome known; commit: -> reply sent."""
        assert self.commit_requested >= self.began
        # A one-shot's prepare rides with its operations, so its outcome may be known before the
        # last answer (the end of execution) comes: its prepare then took no time of its own.
        decided = self.decided or self.replied
        if decided:
            decided = max(decided, self.commit_requested)
        return {
            "execution": (self.commit_requested - self.began) * 1000,
            "prepare": (decided - self.commit_requested) * 1000 if decided else 0.0,
            "commit": (self.replied - decided) * 1000 if self.replied and decided else 0.0,
            "total": (self.replied - self.began) * 1000 if self.replied else 0.0,
        }


class TimingLog:
    def __init__(self, count_max: int = TIMING_COUNT_MAX) -> None:
        assert count_max > 0
        self._recent: collections.deque[tuple[str, int, dict[str, float]]] = collections.deque(maxlen=count_max)
        # How long each termination protocol run took, from its first LogOnce(ABORT) to the decision.
        self.terminations_ms: collections.deque[float] = collections.deque(maxlen=count_max)

    def record(self, timing: TxnTiming) -> dict[str, float]:
        phases = timing.phases_ms()
        self._recent.append((timing.protocol, timing.participant_count, phases))
        return phases

    def summary(self, distributed_only: bool = True) -> dict[str, dict[str, float]]:
        """Median and p99 of each phase per protocol over the recent transactions."""
        by_protocol: dict[str, list[dict[str, float]]] = {}
        for protocol, participants, phases in self._recent:
            if distributed_only and participants < 2:
                continue
            by_protocol.setdefault(protocol, []).append(phases)
        out: dict[str, dict[str, float]] = {}
        for protocol, rows in by_protocol.items():
            stats: dict[str, float] = {"count": float(len(rows))}
            for phase in ("execution", "prepare", "commit", "total"):
                values = sorted(row[phase] for row in rows)
                stats[f"{phase}_p50"] = statistics.median(values)
                stats[f"{phase}_p99"] = values[min(len(values) - 1, int(0.99 * len(values)))]
            out[protocol] = stats
        if self.terminations_ms:
            values = sorted(self.terminations_ms)
            out["termination"] = {
                "count": float(len(values)),
                "min": values[0],
                "p50": statistics.median(values),
                "p99": values[min(len(values) - 1, int(0.99 * len(values)))],
                "max": values[-1],
            }
        return out
