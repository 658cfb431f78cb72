"""Check (e): no partition served by two nodes at once, from the nodes' own ownership log lines

    ownership serve partition=p0 epoch=3 node=n0 at_unix_ms=1700000000000
    ownership stop partition=p0 epoch=3 node=n0 until_unix_ms=1700000000500 reason=released

found anywhere in a line of a node's log file (the node's JSON log wraps them in its message
field). A `serve` opens the interval of (node, partition, epoch) at at_unix_ms; the matching
`stop` closes it at until_unix_ms (the node may serve until then). An interval still open when the
harness killed the node (kill -9, or seen dead) ends at that kill; one still open at the end of
the run ends when the harness stopped the nodes. Two intervals of different nodes for one
partition that overlap are a violation. All nodes share this machine's clock.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_ID = r"[A-Za-z0-9_.:-]+"
SERVE = re.compile(rf"ownership serve partition=({_ID}) epoch=(\d+) node=({_ID}) at_unix_ms=(\d+)")
STOP = re.compile(rf"ownership stop partition=({_ID}) epoch=(\d+) node=({_ID}) until_unix_ms=(\d+) reason=({_ID})")
# Examples kept per check in the summary.
EXAMPLE_COUNT_MAX = 20
LINE_COUNT_MAX = 50_000_000


@dataclass(frozen=True, slots=True)
class Interval:
    partition: str
    epoch: int
    node: str
    start_ms: int
    end_ms: int
    end_reason: str  # the stop line's reason, or "killed", or "run_end"

    def to_json(self) -> dict[str, Any]:
        return {"partition": self.partition, "epoch": self.epoch, "node": self.node, "start_ms": self.start_ms,
                "end_ms": self.end_ms, "end": self.end_reason}


@dataclass(slots=True)
class OwnershipResult:
    line_count: int
    intervals: list[Interval]
    overlaps: list[tuple[Interval, Interval]]
    problems: list[str]  # lines that do not fit (a stop without its serve, a serve twice)


def _end_at_kill(start_ms: int, kills_ms: Sequence[int]) -> int | None:
    index = bisect.bisect_right(kills_ms, start_ms)
    return kills_ms[index] if index < len(kills_ms) else None


def parse_node_log(
    node: str, path: Path, kills_ms: Sequence[int], run_end_ms: int
) -> tuple[int, list[Interval], list[str]]:
    kills = sorted(kills_ms)
    open_: dict[tuple[str, int], int] = {}
    intervals: list[Interval] = []
    problems: list[str] = []
    count = 0
    if not path.exists():
        return 0, [], []
    with path.open(encoding="utf-8", errors="replace") as log:
        for number, line in enumerate(log, 1):
            if number > LINE_COUNT_MAX:
                problems.append(f"{path}: stopped reading after {LINE_COUNT_MAX} lines")
                break
            if "ownership " not in line:
                continue
            if match := SERVE.search(line):
                partition, epoch, who, at_ms = match.group(1), int(match.group(2)), match.group(3), int(match.group(4))
                count += 1
                if who != node:
                    problems.append(f"{path}:{number}: a serve line of node {who} in {node}'s log")
                key = (partition, epoch)
                if key in open_:
                    # Served twice without a stop: the first interval ends at a kill in between, else
                    # it still runs (the second is a repeat of it).
                    previous = open_[key]
                    killed = _end_at_kill(previous, kills)
                    if killed is not None and killed <= at_ms:
                        intervals.append(Interval(partition, epoch, node, previous, killed, "killed"))
                        open_[key] = at_ms
                    continue
                open_[key] = at_ms
            elif match := STOP.search(line):
                partition, epoch, until_ms = match.group(1), int(match.group(2)), int(match.group(4))
                count += 1
                key = (partition, epoch)
                if key not in open_:
                    # A partition taken and given up again before its recovery ended: never served,
                    # so no interval; listed in the notes in case it is a lost serve line instead.
                    problems.append(f"{path}:{number}: stop of {partition} epoch {epoch} with no serve before it")
                    continue
                start = open_.pop(key)
                killed = _end_at_kill(start, kills)
                if killed is not None and killed < until_ms:
                    # A kill came first; the stop line is from a later life, for an interval that
                    # ended at the kill.
                    intervals.append(Interval(partition, epoch, node, start, killed, "killed"))
                else:
                    intervals.append(Interval(partition, epoch, node, start, until_ms, match.group(5)))
    for (partition, epoch), start in open_.items():
        killed = _end_at_kill(start, kills)
        end, reason = (killed, "killed") if killed is not None else (max(run_end_ms, start), "run_end")
        intervals.append(Interval(partition, epoch, node, start, end, reason))
    return count, intervals, problems


def check_ownership(
    logs: Mapping[str, Path], kills_ms: Mapping[str, Sequence[int]], run_end_ms: int
) -> OwnershipResult:
    line_count = 0
    intervals: list[Interval] = []
    problems: list[str] = []
    for node, path in logs.items():
        count, found, bad = parse_node_log(node, path, kills_ms.get(node, ()), run_end_ms)
        line_count += count
        intervals += found
        problems += bad
    overlaps: list[tuple[Interval, Interval]] = []
    by_partition: dict[str, list[Interval]] = {}
    for interval in intervals:
        by_partition.setdefault(interval.partition, []).append(interval)
    for partition_intervals in by_partition.values():
        ordered = sorted(partition_intervals, key=lambda i: (i.start_ms, i.end_ms))
        for index, first in enumerate(ordered):
            for second in ordered[index + 1:]:
                if second.start_ms >= first.end_ms:
                    break
                if second.node != first.node and second.start_ms < second.end_ms and first.start_ms < first.end_ms:
                    overlaps.append((first, second))
    return OwnershipResult(line_count, intervals, overlaps, problems)
