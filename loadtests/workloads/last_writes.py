"""The end-of-run check of the workloads whose data carries no invariant of its own (YCSB,
uniform): after the run, every key a committed transaction wrote holds what the last committed
write to it wrote, and no key holds what an aborted one wrote. A commit the cluster lost, a write
applied out of order, or an abort that left its value behind, fails it. Every write
carries a value of its own (`WriteValues`), so the value read tells which write it came from.

Which write is the last one: a driver sees when each transaction started (its request sent) and
ended (its answer received), not when it took effect. A committed write that started after another
had ended took effect after it (the node answers only once the outcome is decided, and the locks
of strict two-phase locking order conflicting writes), so the earlier one is certainly
overwritten. The values a key may hold are those of its committed writes that no other committed
write certainly overwrote: the latest, and those that overlapped it in time. Those writes overlap
pairwise, so they were all in flight at one instant, each from another client: a key keeps at
most one candidate per concurrent client, whatever order the replies arrive in.

A write whose outcome the driver does not know (`unknown`, or `failed`: no answer the API
promises) may or may not have committed: its key is not checked. Aborted and unavailable writes
committed nothing (the API's promise): the key keeps its candidates, and must not hold their value.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from loadtests.workloads.base import Execute, Program, read_in_batches

# Keys whose last writes are tracked and read back at the end. The check reads them all (20 reads
# of CHECK_BATCH_KEY_COUNT_MAX keys, a second or two) and keeps their candidates in memory (a few
# MB); keys first written after this many are not checked, the ones tracked stay tracked.
CHECKED_KEY_COUNT_MAX = 10_000
# Violations listed one by one; beyond, a count (a lost commit usually loses many keys at once).
VIOLATION_EXAMPLE_COUNT_MAX = 5
# How much of a value a violation shows: the unique prefix WriteValues puts first.
VALUE_SHOWN_CHARS_MAX = 24
_NOTHING_COMMITTED = ("aborted", "unavailable")
_EARLIEST = float("-inf")


@dataclass(frozen=True, slots=True)
class _Write:
    value: str
    started: float
    ended: float


class WriteValues:
    """Values unique to each write: a token of this process, a counter, then `filler` up to
    `length` characters (at least the unique part), so a value read back names its write even
    across the processes of a distributed Locust run."""

    def __init__(self, length: int, filler: str) -> None:
        self.length = length
        self.filler = filler
        self.token = secrets.token_hex(4)
        self.counter = itertools.count()

    def next(self) -> str:
        unique = f"{self.token}.{next(self.counter)}."
        return unique + self.filler * max(0, self.length - len(unique))


class LastWrites:
    """The candidates of each tracked key (see the module's docstring); `initial` is the value
    every key was loaded with."""

    def __init__(self, initial: str) -> None:
        self.initial = initial
        self._keys: dict[str, list[_Write] | None] = {}  # None: an outcome unknown, not checked
        self.untracked_writes = 0  # writes to keys beyond CHECKED_KEY_COUNT_MAX

    def record(self, writes: Mapping[str, str], outcome: str, started: float, ended: float) -> None:
        """One transaction's writes (key -> value), its outcome, and when it started and ended."""
        for key, value in writes.items():
            if key not in self._keys:
                if len(self._keys) >= CHECKED_KEY_COUNT_MAX:
                    self.untracked_writes += 1
                    continue
                # Loaded before the clock started: any committed write overwrites it.
                self._keys[key] = [_Write(self.initial, _EARLIEST, _EARLIEST)]
            candidates = self._keys[key]
            if candidates is None or outcome in _NOTHING_COMMITTED:
                continue
            if outcome != "committed":
                self._keys[key] = None
                continue
            kept = [write for write in candidates if write.ended >= started]
            if not any(write.started > ended for write in kept):
                kept.append(_Write(value, started, ended))
            self._keys[key] = kept

    @property
    def unchecked_keys(self) -> int:
        return sum(candidates is None for candidates in self._keys.values())

    def check(self, read: Callable[[Sequence[str]], dict[str, str | None]]) -> list[str]:
        """Violations: keys that hold a value no last committed write wrote."""
        keys = [key for key, candidates in self._keys.items() if candidates is not None]
        values = read_in_batches(read, keys)
        wrong: list[str] = []
        for key in keys:
            candidates = self._keys[key]
            assert candidates is not None
            allowed = {write.value for write in candidates}
            value = values.get(key)
            if value not in allowed:
                shown = " or ".join(sorted(_shown(write.value) for write in candidates))
                found = "nothing (the key is gone)" if value is None else _shown(value)
                wrong.append(f"key {key} holds {found}, but the last committed write to it wrote {shown}")
        if len(wrong) > VIOLATION_EXAMPLE_COUNT_MAX:
            wrong = [*wrong[:VIOLATION_EXAMPLE_COUNT_MAX],
                     f"and {len(wrong) - VIOLATION_EXAMPLE_COUNT_MAX} more keys that do not hold their last "
                     f"committed write, of {len(keys)} checked"]
        return wrong


def _shown(value: str) -> str:
    return repr(value if len(value) <= VALUE_SHOWN_CHARS_MAX else value[:VALUE_SHOWN_CHARS_MAX] + "...")


def tracked_one_shot(ops: Sequence[dict[str, str]], last_writes: LastWrites) -> Callable[[], Program]:
    """A one-shot transaction of `ops` whose puts `last_writes` records with the outcome: the
    clock is read right before the request goes out and right after its answer came."""
    frozen = tuple(ops)
    writes = {op["key"]: op["value"] for op in frozen if op["op"] == "put"}

    def program() -> Program:
        started = time.monotonic()
        reply = yield Execute(frozen)
        if writes:
            last_writes.record(writes, reply.outcome, started, time.monotonic())

    return program
