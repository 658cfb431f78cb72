"""The fault schedule (a pure function of the seed and the run's shape) and the injector that plays
it against the cluster. Every fault has an end inside the fault phase, and `heal_all` ends
whatever is left, so nothing outlives the phase however it ends (its deadline, Ctrl-C, an error).

Kinds: on a proxied link, `latency` (fixed delay), `jitter` (delay +/- a large jitter), `timeout`
(toxiproxy's timeout toxic: data is dropped, and the connection closed after `timeout` ms or, at 0,
when the toxic goes), `reset_peer` (TCP RST after `timeout` ms); `partition` (disable the proxies
of both directions between two nodes, or, on Redis, Azure Blob or DynamoDB, one node's storage
proxy); on a process, `kill` (kill -9, restarted at the fault's end) and `pause` (SIGSTOP, SIGCONT
at its end).
"""

from __future__ import annotations

import datetime
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests.chaos.cluster import STORAGE, ChaosCluster
from loadtests.chaos.toxiproxy import ToxiproxyError

TOXIC_KINDS = ("latency", "jitter", "timeout", "reset_peer")
PROCESS_KINDS = ("kill", "pause")
FAULT_KINDS = (*TOXIC_KINDS, "partition", *PROCESS_KINDS)
# Relative draw weights: delays are the commonest trouble on a real network, process faults the
# rarest (and the costliest: a restart waits out recovery).
KIND_WEIGHTS = {"latency": 3, "jitter": 2, "timeout": 2, "reset_peer": 2, "partition": 2, "kill": 1, "pause": 1}
# Share of link faults (toxics, partitions) that hit a node->storage link when there is one.
STORAGE_LINK_SHARE = 0.35
# A draw that cannot be placed (too many faults at once, every node busy) is retried this often per
# fault wanted before the schedule ends early.
DRAW_ATTEMPTS_PER_FAULT = 20
FAULT_S_MIN = 0.3
# A node that exits on its own is restarted at most this often per run: a node that cannot stay
# up should not turn the run into a restart loop.
CRASH_RESTART_COUNT_MAX = 3
TICK_S = 0.05


@dataclass(frozen=True, slots=True)
class Fault:
    index: int
    kind: str
    start_s: float
    end_s: float
    # A proxy name for toxics and storage partitions, "na|nb" for a partition between two nodes,
    # a node id for process faults.
    target: str
    stream: str = ""
    attributes: tuple[tuple[str, int], ...] = ()

    @property
    def proxies(self) -> tuple[str, ...]:
        if self.kind == "partition" and "|" in self.target:
            a, b = self.target.split("|")
            return (f"{a}-{b}", f"{b}-{a}")
        if self.kind in PROCESS_KINDS:
            return ()
        return (self.target,)

    @property
    def toxic_name(self) -> str:
        return f"f{self.index}"

    def describe(self) -> str:
        extra = f" {self.stream}" if self.stream else ""
        if self.attributes:
            extra += " " + " ".join(f"{k}={v}" for k, v in self.attributes)
        return f"#{self.index} {self.kind} {self.target}{extra} [{self.start_s:.2f}s..{self.end_s:.2f}s]"

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "kind": self.kind, "start_s": round(self.start_s, 3),
                "end_s": round(self.end_s, 3), "target": self.target, "stream": self.stream,
                "attributes": dict(self.attributes)}


@dataclass(frozen=True, slots=True)
class ScheduleShape:
    duration_s: float
    nodes: tuple[str, ...]
    peer_links: tuple[str, ...]
    storage_links: tuple[str, ...]
    kinds: tuple[str, ...] = FAULT_KINDS
    count_max: int = 60
    concurrency_max: int = 3
    process_concurrency_max: int = 1
    gap_s_mean: float = 0.8
    fault_s_min: float = 0.5
    fault_s_max: float = 3.0
    # Kills and pauses get their own range: one that outlasts a lease (4 s) plus the failover delay
    # (4 s) lets another node take the partitions, and a paused owner wake up deposed.
    process_fault_s_min: float = 1.0
    process_fault_s_max: float = 12.0
    warmup_s: float = 1.0


def make_schedule(seed: int, shape: ScheduleShape) -> list[Fault]:
    """Faults in start order. At most `concurrency_max` at once (`process_concurrency_max` of them on
    processes), never two on one node's process or one proxy's enabled state at once, and each ends
    by `duration_s`."""
    rng = random.Random(seed)
    kinds = [kind for kind in shape.kinds if kind in KIND_WEIGHTS]
    weights = [KIND_WEIGHTS[kind] for kind in kinds]
    faults: list[Fault] = []
    at = shape.warmup_s
    for _ in range(DRAW_ATTEMPTS_PER_FAULT * shape.count_max):
        if len(faults) >= shape.count_max or not kinds:
            break
        at += rng.expovariate(1.0 / shape.gap_s_mean)
        if shape.duration_s - at < FAULT_S_MIN:
            break
        kind = rng.choices(kinds, weights)[0]
        low, high = ((shape.process_fault_s_min, shape.process_fault_s_max) if kind in PROCESS_KINDS
                     else (shape.fault_s_min, shape.fault_s_max))
        end = min(at + rng.uniform(low, high), shape.duration_s)
        active = [f for f in faults if f.end_s > at]
        if len(active) >= shape.concurrency_max:
            continue
        fault = _draw(rng, kind, len(faults), start=at, end=end, shape=shape, active=active)
        if fault is not None:
            faults.append(fault)
    return faults


def _draw(rng: random.Random, kind: str, index: int, *, start: float, end: float, shape: ScheduleShape,
          active: Sequence[Fault]) -> Fault | None:
    if kind in PROCESS_KINDS:
        busy = {f.target for f in active if f.kind in PROCESS_KINDS}
        if len(busy) >= shape.process_concurrency_max:
            return None
        free = [node for node in shape.nodes if node not in busy]
        return Fault(index, kind, start, end, rng.choice(free)) if free else None
    on_storage = bool(shape.storage_links) and rng.random() < STORAGE_LINK_SHARE
    if kind == "partition":
        disabled = {proxy for f in active if f.kind == "partition" for proxy in f.proxies}
        if on_storage:
            choices = [link for link in shape.storage_links if link not in disabled]
        else:
            pairs = [(a, b) for i, a in enumerate(shape.nodes) for b in shape.nodes[i + 1:]]
            choices = [f"{a}|{b}" for a, b in pairs if not disabled.intersection((f"{a}-{b}", f"{b}-{a}"))]
        return Fault(index, kind, start, end, rng.choice(choices)) if choices else None
    link = rng.choice(shape.storage_links if on_storage else shape.peer_links)
    stream = rng.choice(("upstream", "downstream"))
    attributes: dict[str, int]
    if kind == "latency":
        attributes = {"latency": rng.randint(20, 300), "jitter": 0}
    elif kind == "jitter":
        attributes = {"latency": rng.randint(10, 100), "jitter": rng.randint(50, 400)}
    elif kind == "timeout":
        # 0: a black hole until the toxic goes; otherwise the connection is also closed after it.
        attributes = {"timeout": rng.choice((0, rng.randint(200, 2_000)))}
    else:
        assert kind == "reset_peer", kind
        attributes = {"timeout": rng.randint(0, 500)}
    return Fault(index, kind, start, end, link, stream, tuple(sorted(attributes.items())))


@dataclass(slots=True)
class Crash:
    node: str
    exit_code: int
    at_s: float
    log_tail: str


@dataclass(slots=True)
class InjectorReport:
    applied: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    crashes: list[Crash] = field(default_factory=list)
    restarts: Counter[str] = field(default_factory=Counter)


class Injector:
    """Plays a schedule on the cluster (in the calling thread, so Ctrl-C lands here) and watches for
    nodes that exit on their own, restarting them (bounded) so the run goes on."""

    def __init__(self, cluster: ChaosCluster, schedule: Sequence[Fault], log_path: Path,
                 say: Callable[[str], None] | None = None) -> None:
        self.cluster = cluster
        self.schedule = list(schedule)
        self.report = InjectorReport()
        self._log = log_path.open("a", encoding="utf-8")
        self._say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self._started = time.monotonic()
        self._lock = threading.Lock()

    def close(self) -> None:
        self._log.close()

    def _note(self, text: str) -> None:
        # Wall clock in the nodes' log format (UTC, ms), to line faults up with node log lines.
        wall = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
        line = f"{wall} {time.monotonic() - self._started:8.3f}s {text}"
        self._log.write(line + "\n")
        self._log.flush()
        self._say(f"chaos: {line}")

    def run(self, stop: threading.Event, until_s: float = 0.0) -> None:
        """Every fault applied at its start and removed at its end; returns at `until_s` or when the
        last fault ended, whichever is later, or once `stop` is set (faults still active then are
        left for `heal_all`)."""
        self._started = time.monotonic()
        # At one instant a removal goes first: a fault drawn to start as another ends may need the
        # node or proxy that one frees.
        actions: list[tuple[float, int, Fault | None]] = sorted(
            [(f.start_s, 1, f) for f in self.schedule] + [(f.end_s, 0, f) for f in self.schedule],
            key=lambda item: (item[0], item[1], item[2].index if item[2] else 0))
        actions.append((until_s, 0, None))  # the end of the phase: nothing to do but wait for it
        for at_s, is_start, fault in actions:
            while not stop.is_set():
                remaining = at_s - (time.monotonic() - self._started)
                self.watch()
                if remaining <= 0:
                    break
                stop.wait(min(TICK_S, remaining))
            if stop.is_set():
                return
            if fault is None:
                continue
            try:
                if is_start:
                    self._apply(fault)
                else:
                    self._remove(fault)
            except (ToxiproxyError, OSError, AssertionError) as error:
                self.report.errors.append(f"{fault.describe()}: {type(error).__name__}: {error}")
                self._note(f"could not {'apply' if is_start else 'remove'} {fault.describe()}: {error}")

    def _apply(self, fault: Fault) -> None:
        if fault.kind in TOXIC_KINDS:
            toxic = "latency" if fault.kind == "jitter" else fault.kind
            self.cluster.toxiproxy.add_toxic(fault.target, fault.toxic_name, toxic, fault.stream,
                                             dict(fault.attributes))
        elif fault.kind == "partition":
            for proxy in fault.proxies:
                self.cluster.toxiproxy.set_enabled(proxy, False)
        elif fault.kind == "kill":
            if not self.cluster.nodes[fault.target].alive:
                self._note(f"skip {fault.describe()}: the node is down")
                return
            self.cluster.kill(fault.target)
        else:
            assert fault.kind == "pause", fault.kind
            if not self.cluster.nodes[fault.target].alive:
                self._note(f"skip {fault.describe()}: the node is down")
                return
            self.cluster.pause(fault.target)
        self.report.applied[fault.kind] += 1
        self._note(f"apply {fault.describe()}")

    def _remove(self, fault: Fault) -> None:
        if fault.kind in TOXIC_KINDS:
            self.cluster.toxiproxy.remove_toxic(fault.target, fault.toxic_name)
        elif fault.kind == "partition":
            for proxy in fault.proxies:
                self.cluster.toxiproxy.set_enabled(proxy, True)
        elif fault.kind == "kill":
            node = self.cluster.nodes[fault.target]
            if node.killed and not node.alive:
                self.cluster.start(fault.target)
        else:
            self.cluster.resume(fault.target)
        self._note(f"remove {fault.describe()}")

    def watch(self) -> None:
        """Record nodes that exited without being killed, and restart them (bounded)."""
        for node_id, code in self.cluster.unexpected_exits():
            node = self.cluster.nodes[node_id]
            tail = node.member.log_tail()
            self.report.crashes.append(Crash(node_id, code, round(time.monotonic() - self._started, 3), tail))
            # Its ownership intervals end no later than this (it was seen dead now).
            node.kill_times_ms.append(int(time.time() * 1000))
            self._note(f"node {node_id} exited on its own (code {code}); last log lines:\n{tail[-1500:]}")
            node.killed = True  # down now: counted once, restarted below or left down
            if self.report.restarts[node_id] < CRASH_RESTART_COUNT_MAX:
                self.report.restarts[node_id] += 1
                self.cluster.start(node_id)
                self._note(f"restarted {node_id} after its exit")

    def heal_all(self) -> None:
        """End every fault: toxics removed and proxies enabled (toxiproxy's reset), every paused node
        continued, every node the harness killed started again. Safe to call more than once."""
        try:
            self.cluster.toxiproxy.reset()
        except ToxiproxyError as error:
            self.report.errors.append(f"heal: {error}")
            self._note(f"heal: toxiproxy reset failed: {error}")
        for node_id, node in self.cluster.nodes.items():
            if node.paused:
                self.cluster.resume(node_id)
            if node.killed and not node.alive:
                self.cluster.start(node_id)
        self._note("healed: no toxic, every proxy enabled, every node running")


def storage_links_of(cluster: ChaosCluster) -> tuple[str, ...]:
    return tuple(name for name, link in cluster.links.items() if link.target == STORAGE)
