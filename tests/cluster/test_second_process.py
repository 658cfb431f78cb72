"""Two processes running as one node id, on real processes: a pod deleted with `kubectl delete
--force` while its process lived on, beside its replacement. The replacement takes the node's
identity in storage before its recovery; the first process must stop serving, at its next
coordinator-log write (storage refuses it) or its next read of the identity record (every
identity_check_ms), and no transaction it answered COMMIT for may be lost. It does not exit: a
kubelet cut off from the API server would restart it, and its new take would depose the
replacement in turn (found by review). It parks: /healthz stays up, /readyz says 503, every
transaction is refused. It exits (status 75, for its supervisor to restart it) only once the
process that took the identity renews it no more. The simulator explores the interleavings
(tests/protocol/test_twins.py); this checks the runtime's side of it."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cornus.protocol.config import ProtocolConfig
from cornus.runtime.parking import EXIT_CODE_IDENTITY_VACANT
from tests.cluster.conftest import storage_for
from tests.cluster.harness import Cluster, NodeProcess, keys_on, running_cluster
from tests.conftest import Services
from tests.worker import free_port

# The first process parks within one identity check of the take, plus the time a loaded machine
# takes to schedule it.
PARK_TIMEOUT_S = ProtocolConfig().identity_check_ms / 1000 + 10
TAKE_TIMEOUT_S = 30.0
HEALTH_TIMEOUT_S = 5.0


def _grpc_health(target: str) -> int:
    with grpc.insecure_channel(target) as channel:
        request = health_pb2.HealthCheckRequest(service="")
        return health_pb2_grpc.HealthStub(channel).Check(request, timeout=HEALTH_TIMEOUT_S).status


def _wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.05)


def _start_second_process(cluster: Cluster) -> NodeProcess:
    """Start a second process of n0 (the replacement: the same node id on ports of its own, since
    the old pod's address is gone, but its process runs on and its peers' connections to it stay
    open) and wait until it took the identity; the cluster's n0 stays the first process."""
    first = cluster.nodes["n0"]
    second = NodeProcess("n0", free_port(), free_port())
    cluster.nodes["n0"] = second
    try:
        cluster.start("n0", wait=False)
        _wait_for(lambda: "took its identity epoch=2" in cluster.log("n0"), TAKE_TIMEOUT_S,
                  "the second process takes the identity")
    except BaseException:
        cluster.kill("n0")  # the cluster's stop would not see it
        raise
    finally:
        cluster.nodes["n0"] = first
    return second


# 2PC, whose coordinator logs, on the emulator; Cornus, whose coordinator logs nothing (its first
# process stops at its periodic check), on Redis, whose identity record lives in another key slot
# than the partitions' records.
@pytest.mark.services
@pytest.mark.parametrize(("protocol", "backend"), [("2pc", "emulator"), ("cornus", "redis")])
def test_a_second_process_of_a_node_stops_the_first_and_loses_no_commit(
    services: Services, tmp_path: Path, protocol: str, backend: str
) -> None:
    with running_cluster(protocol, storage_for(backend, services, tmp_path), grpc_api=True) as cluster:
        cluster.start_all()
        first = cluster.nodes["n0"]
        assert first.process is not None
        # A transaction n0 coordinates over two partitions of other nodes: 2PC logs its COMMIT in
        # n0's coordinator log.
        keys = [keys_on("p1", cluster.partition_count, 1, "a")[0], keys_on("p2", cluster.partition_count, 1, "b")[0]]
        assert cluster.execute("n0", [{"op": "put", "key": k, "value": "before"} for k in keys]).status_code == 200

        second = _start_second_process(cluster)
        try:
            # The first process, asked to commit now, may answer only what storage holds.
            try:
                response = cluster.execute("n0", [{"op": "put", "key": k, "value": "after"} for k in keys])
                committed = response.status_code == 200 and response.json()["outcome"] == "committed"
            except httpx.HTTPError:
                committed = False  # it stopped first
            _wait_for(lambda: "deposed" in cluster.log("n0"), PARK_TIMEOUT_S, "the first process parks")
            assert "another process took node id n0" in cluster.log("n0"), cluster.log("n0")
            # Parked: alive, not ready, refusing work, and never taking the identity back.
            assert first.alive
            assert cluster.get("n0", "/healthz").status_code == 200
            assert cluster.get("n0", "/readyz").status_code == 503
            refused = cluster.execute("n0", [{"op": "put", "key": keys[0], "value": "parked"}])
            assert refused.status_code == 503, refused.text
            _wait_for(lambda: _grpc_health(first.grpc_target) == health_pb2.HealthCheckResponse.NOT_SERVING,
                      PARK_TIMEOUT_S, "the parked process's gRPC health says NOT_SERVING")
            assert first.alive
        finally:
            cluster.nodes["n0"] = second
            cluster.kill("n0")
            cluster.nodes["n0"] = first
            cluster.kill("n0")  # its pod's deletion reaches its kubelet at last
        # n0 back at its address (a third process, which recovers its coordinator log), so that a
        # 2PC transaction the first one left in doubt is answered.
        cluster.start("n0")
        # Whatever the first process answered, the data says the same: a COMMIT it returned
        # landed on both partitions, and anything else landed on both or neither.
        values = cluster.read("n1", keys)
        if committed:
            assert values == dict.fromkeys(keys, "after"), values
        else:
            assert len(set(values.values())) == 1, values


# Renewals every 200 ms, and a storage deadline of 1 s: a parked process takes the identity for
# vacant after 3 * 200 ms + 1 s + the clock slack (identity_vacant_ms).
WATCH_SETTINGS = {"identity_check_ms": 200, "clock_slack_ms": 500}
WATCH_STORAGE = {"timeout_ms_call": "1000"}
VACANT_S = ProtocolConfig(identity_check_ms=200, storage_deadline_ms=1000, clock_slack_ms=500,
                          gc_grace_ms=2500).identity_vacant_ms / 1000
# How long it may take a loaded machine past that to see it and exit.
EXIT_TIMEOUT_S = VACANT_S + 15


@pytest.mark.services
def test_a_parked_process_exits_once_the_process_that_deposed_it_is_gone(services: Services, tmp_path: Path) -> None:
    """Which process of a node takes its identity last is a race: the older one can win and then
    go away (its pod deleted), leaving the newer one parked with nobody holding the identity. The
    simulator found it (tests/protocol/test_twins.py); before the watch, the parked process
    stayed parked until restarted by hand. Here the second process deposes the first, then dies."""
    storage = {**storage_for("redis", services, tmp_path), **WATCH_STORAGE}
    with running_cluster("cornus", storage, settings=WATCH_SETTINGS) as cluster:
        cluster.start_all()
        first = cluster.nodes["n0"]
        second = _start_second_process(cluster)
        _wait_for(lambda: "deposed" in cluster.log("n0"), PARK_TIMEOUT_S, "the first process parks")
        # While the second process lives and renews, the first stays parked, well past the wait.
        time.sleep(VACANT_S + 1)
        assert first.alive, cluster.log("n0")
        cluster.nodes["n0"] = second
        cluster.kill("n0")
        cluster.nodes["n0"] = first
        assert cluster.wait_exit("n0", EXIT_TIMEOUT_S) == EXIT_CODE_IDENTITY_VACANT, cluster.log("n0")
        assert "renews it no more" in cluster.log("n0")
        # Its supervisor restarts it: the restart takes the identity, recovers and commits.
        cluster.start("n0")
        assert "took its identity epoch=3" in cluster.log("n0")
        keys = [keys_on("p1", cluster.partition_count, 1, "a")[0], keys_on("p2", cluster.partition_count, 1, "b")[0]]
        response = cluster.execute("n0", [{"op": "put", "key": k, "value": "back"} for k in keys])
        assert response.status_code == 200 and response.json()["outcome"] == "committed", response.text
