"""The bench's local clusters, from start to clean-up, for `cornus bench` (cluster.py) and
`cornus termination-bench` (termination.py): `cornus serve` processes on 127.0.0.1 over the run's
own storage (loadtests.bench.namespaces), started and waited for until they serve, one of them
restarted with a failpoint armed when asked, all stopped at the end. Then the clean-up: the run's
directory goes, unless the run failed once its nodes had started (their logs in it say why, and
the error gets a note naming it; `logs_dir` copies them elsewhere whatever happened); the
container or table the run created goes too.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cornus.protocol.config import Protocol
from loadtests.bench import namespaces
from services.local_cluster import (
    PORT_PICK_COUNT_MAX,
    ClusterNode,
    StopSignals,
    local_members,
    port_was_taken,
    start_node,
    stop_nodes,
    wait_cluster_ready,
)
from storage_adapters.factory import StoreConfig

# A node that does not serve this long after its start has failed to start: it waits one storage
# deadline out first, then takes its partitions over on storage that may be a remote service.
READY_TIMEOUT_S = 60.0
# Every bench node's settings, before the run's own (which may override them): a run's storage is
# the bench's (thrown away after, or left to the next run), so its nodes need not wait out the
# collection of their transactions when they stop (RuntimeLimits.timeout_ms_stop_collect), which
# would add a grace period to every run.
NODE_SETTINGS = ("timeout_ms_stop_collect=0",)


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """What a bench cluster runs: its shape, its protocol, its storage and the nodes' settings."""

    nodes: int
    partitions: int
    protocol: Protocol
    storage: StoreConfig
    storage_argv: Sequence[str]  # the flags that hand `storage` to the nodes
    settings: Sequence[str] = ()  # --set NAME=VALUE for every node
    # Added to every node's environment: storage secrets (argv is visible to every user of the
    # machine), the lock policy.
    environ: Mapping[str, str] = field(default_factory=dict)
    run_index: int = 0  # the sweep point and trial, which name the run's storage
    flush_redis: bool = False
    keep_storage: bool = False  # leave the container or table the run created
    # Where the nodes' logs are copied when the run ends, however it ended (None: only a failed
    # run keeps them, in its directory): `cornus bench --keep-logs`.
    logs_dir: Path | None = None
    label: str = "the cluster"  # how errors name it


@dataclass
class BenchCluster:
    spec: ClusterSpec
    members: list[ClusterNode]
    peers: str
    argv: list[str]
    stop: StopSignals
    data: Path  # the run's directory: the nodes' logs, the emulator's file

    def start(self, nodes: Sequence[ClusterNode] | None = None, *, environ: Mapping[str, str] | None = None,
              failure: str = "") -> None:
        """Start `nodes` (every member by default) and wait until they serve; RuntimeError
        (`failure`, or that the cluster did not start) if one dies or the wait times out. The
        whole cluster starts again on other ports (PORT_PICK_COUNT_MAX times in all) when a node
        of its first start found a port taken: the peers' list names them all, so none keeps its
        ports (the members stay the same objects, with their new ports). A restart of some nodes
        keeps their ports, and fails as any other failure if one is taken."""
        chosen = list(self.members if nodes is None else nodes)
        for pick in range(1, PORT_PICK_COUNT_MAX + 1):
            for node in chosen:
                start_node(node, self.peers, self.argv, [*NODE_SETTINGS, *self.spec.settings],
                           environ={**self.spec.environ, **(environ or {})})
            if wait_cluster_ready(chosen, self.stop, READY_TIMEOUT_S):
                return
            if nodes is not None or not port_was_taken(chosen) or pick == PORT_PICK_COUNT_MAX:
                break
            stop_nodes(self.members, self.stop)
            fresh, self.peers = local_members(self.spec.nodes, self.spec.protocol, self.spec.partitions, self.data)
            for member, picked in zip(self.members, fresh, strict=True):
                assert member.log_path == picked.log_path and not member.alive, member
                member.config, member.api_port, member.peer_port = picked.config, picked.api_port, picked.peer_port
            print(f"cornus: starting {self.spec.label} again on other ports (pick {pick + 1} of "
                  f"{PORT_PICK_COUNT_MAX})", file=sys.stderr, flush=True)
        raise RuntimeError(failure or f"{self.spec.label} did not start")

    def restart(self, node: ClusterNode, *, environ: Mapping[str, str] | None = None) -> None:
        """Stop `node` and start it again, with `environ` added to its environment."""
        stop_nodes([node], self.stop)
        self.start([node], environ=environ, failure=f"{node.config.node_id} did not restart")


@contextlib.contextmanager
def bench_cluster(spec: ClusterSpec, *, prefix: str = "cornus-bench-") -> Iterator[BenchCluster]:
    """A cluster of `spec` whose nodes are not started yet (`start` them); stopped and cleaned up
    on the way out, whatever happened."""
    data = Path(tempfile.mkdtemp(prefix=prefix))
    members: list[ClusterNode] = []
    run: namespaces.RunStorage | None = None
    keep_data = False
    try:
        run = namespaces.run_storage(spec.storage, spec.protocol, data, spec.run_index)
        namespaces.prepare(run, flush_redis=spec.flush_redis)
        members, peers = local_members(spec.nodes, spec.protocol, spec.partitions, data)
        cluster = BenchCluster(spec, members, peers, [*spec.storage_argv, *run.argv], StopSignals(), data)
        try:
            yield cluster
        finally:
            stop_nodes(members, cluster.stop)
    except Exception as error:
        keep_data = keep_logs(error, data, members)
        raise
    finally:
        if run is not None:
            namespaces.release(run, keep=spec.keep_storage)
        if spec.logs_dir is not None:
            copy_logs(members, spec.logs_dir / f"{spec.protocol.value}-{spec.run_index}")
        if not keep_data:
            shutil.rmtree(data, ignore_errors=True)


def copy_logs(members: Sequence[ClusterNode], into: Path) -> None:
    """Copy the logs of the nodes that started into `into` (made if missing)."""
    into.mkdir(parents=True, exist_ok=True)
    for member in members:
        if member.log_path.exists():
            shutil.copyfile(member.log_path, into / member.log_path.name)


def keep_logs(error: Exception, data: Path, members: Sequence[ClusterNode]) -> bool:
    """Whether a failed run keeps its directory: once its nodes started, their logs in it say why
    it failed, and `error` gets a note naming it (the command line prints it)."""
    if not any(member.process is not None for member in members):
        return False
    error.add_note(f"node logs kept in {data}")
    return True
