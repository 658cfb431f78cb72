"""Read a test timeline (CORNUS_TEST_TIMELINE, tests/conftest.py) and say where the suite's wall
time went: each worker's busy time and end, the tests of the worker that ended last, the longest
tests and, where the file has CPU columns, the tests and files that spent the most CPU (their
worker's and their waited-for child processes', and the nodes they started from a node launcher,
which FILE.nodes holds: services/node_launcher.py). Usage: python3 scripts/timeline.py FILE
[LONGEST_COUNT]."""

from __future__ import annotations

import collections
import os
import sys


def main(path: str, longest_count: int = 25) -> None:
    rows = []
    cpu_s: dict[str, float] = {}
    with open(path) as timeline:
        for line in timeline:
            worker, start, end, nodeid, *cpu = line.rstrip("\n").split("\t")
            rows.append((worker, float(start), float(end), nodeid))
            if cpu:
                cpu_s[nodeid] = float(cpu[0]) + float(cpu[1])
    if not rows:
        raise SystemExit(f"{path}: no tests")
    first = min(start for _, start, _, _ in rows)
    by_worker: dict[str, list[tuple[float, float, str]]] = collections.defaultdict(list)
    for worker, start, end, nodeid in rows:
        by_worker[worker].append((start - first, end - first, nodeid))
    span_s = max(end for _, _, end, _ in rows) - first
    print(f"{len(rows)} tests, {len(by_worker)} workers, {span_s:.0f} s from the first start to the last end")
    for worker, tests in sorted(by_worker.items(), key=lambda item: max(e for _, e, _ in item[1])):
        busy = sum(end - start for start, end, _ in tests)
        print(f"  {worker}: {len(tests)} tests, busy {busy:.0f} s, ends at {max(e for _, e, _ in tests):.0f} s")
    last = max(by_worker, key=lambda w: max(e for _, e, _ in by_worker[w]))
    print(f"the last worker ({last}), its tests over 5 s, in order:")
    for start, end, nodeid in sorted(by_worker[last]):
        if end - start > 5:
            print(f"  {start:6.0f}-{end:4.0f} s  {end - start:5.1f} s  {nodeid}")
    print(f"the {longest_count} longest tests:")
    for worker, start, end, nodeid in sorted(rows, key=lambda r: r[1] - r[2])[:longest_count]:
        print(f"  {end - start:5.1f} s  {worker}  at {start - first:4.0f} s  {nodeid}")

    if not cpu_s:
        return
    node_cpu_s = 0.0
    if os.path.exists(f"{path}.nodes"):
        with open(f"{path}.nodes") as nodes:
            for line in nodes:
                nodeid, user_s, system_s = line.rstrip("\n").split("\t")
                cpu_s[nodeid or "(no test)"] = cpu_s.get(nodeid or "(no test)", 0.0) + float(user_s) + float(system_s)
                node_cpu_s += float(user_s) + float(system_s)
        print(f"nodes started from launchers: {node_cpu_s:.0f} s of CPU, counted with the tests that started them")
    print(f"CPU: {sum(cpu_s.values()):.0f} s in all; the {longest_count} tests that spent the most:")
    for nodeid, spent_s in sorted(cpu_s.items(), key=lambda item: -item[1])[:longest_count]:
        print(f"  {spent_s:6.1f} s  {nodeid}")
    by_file: dict[str, float] = collections.defaultdict(float)
    for nodeid, spent_s in cpu_s.items():
        by_file[nodeid.split("::")[0]] += spent_s
    print(f"the {longest_count} files that spent the most CPU:")
    for path_name, spent_s in sorted(by_file.items(), key=lambda item: -item[1])[:longest_count]:
        print(f"  {spent_s:6.1f} s  {path_name}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
