"""The critical path of one-shot transactions, from the node timelines scripts/timeline.sh records.

For `--clients 1` runs: with one transaction at a time, each coordinator's HTTP request is followed
by its request to the other partition's owner, that owner's answer, vote write and vote, and the
coordinator's response; events are matched by their order. Prints the median time of each step
from the moment the coordinator read the HTTP request. With more clients the steps of concurrent
transactions interleave and the matching does not hold.

    python3 scripts/timeline_report.py DIR
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

Event = tuple[float, str, str, int]  # (seconds, node, event, bytes)
# A participant's steps must follow the coordinator's request within this long to be matched.
MATCH_WINDOW_S = 0.02


def load(directory: Path) -> list[Event]:
    events: list[Event] = []
    for path in sorted(directory.glob("*.txt")):
        for line in path.read_text().splitlines():
            moment, node, event, size = line.split()
            events.append((float(moment), node, event, int(size)))
    events.sort()
    return events


def _next(events: list[Event], start: int, node: str, name: str, until_s: float) -> int | None:
    for index in range(start, len(events)):
        moment, who, event, _ = events[index]
        if moment > until_s:
            return None
        if who == node and event == name:
            return index
    return None


def steps_of(events: list[Event]) -> dict[str, list[float]]:
    """Each step's offsets in microseconds from the coordinator's HTTP read, one per transaction."""
    steps: dict[str, list[float]] = defaultdict(list)
    for index, (begin_s, coordinator, event, _) in enumerate(events):
        if event != "http_in":
            continue
        end = _next(events, index + 1, coordinator, "http_out", begin_s + MATCH_WINDOW_S)
        request = _next(events, index + 1, coordinator, "peer_out", begin_s + MATCH_WINDOW_S)
        if end is None or request is None or request > end:
            continue
        end_s = events[end][0]
        mark = {"ASGI app entered": _next(events, index + 1, coordinator, "asgi", end_s),
                "request out (coordinator)": request}
        arrival = next((i for i in range(request + 1, end) if events[i][2] == "peer_in"
                        and events[i][1] != coordinator), None)
        if arrival is not None:
            participant = events[arrival][1]
            mark["request in (participant)"] = arrival
            answer = _next(events, arrival + 1, participant, "peer_out", end_s)
            write = _next(events, arrival + 1, participant, "redis_out", end_s)
            mark["answer out (participant)"] = answer
            mark["vote write out (participant)"] = write
            if write is not None:
                written = _next(events, write + 1, participant, "redis_in", end_s)
                mark["vote write back (participant)"] = written
                if written is not None:
                    mark["vote out (participant)"] = _next(events, written + 1, participant, "peer_out", end_s)
            vote = mark.get("vote out (participant)")
            if vote is not None:
                mark["vote in (coordinator)"] = _next(events, vote + 1, coordinator, "peer_in", end_s)
        # The coordinator's own partition votes too: whichever vote comes last holds the response.
        own_write = _next(events, request + 1, coordinator, "redis_out", end_s)
        mark["own vote write out (coordinator)"] = own_write
        if own_write is not None:
            mark["own vote write back (coordinator)"] = _next(events, own_write + 1, coordinator, "redis_in", end_s)
        mark["response out (coordinator)"] = end
        for name, position in mark.items():
            if position is not None:
                steps[name].append((events[position][0] - begin_s) * 1e6)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path)
    steps = steps_of(load(parser.parse_args().directory))
    if not steps:
        raise SystemExit("no transaction found: was the run one with --clients 1, and recorded?")
    print(f"{'step (median us after the coordinator read the HTTP request)':<64} {'us':>7} {'count':>6}")
    for name, offsets in sorted(steps.items(), key=lambda item: statistics.median(item[1])):
        print(f"{name:<64} {statistics.median(offsets):7.0f} {len(offsets):6d}")


if __name__ == "__main__":
    main()
