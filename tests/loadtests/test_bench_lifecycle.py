"""The bench's local clusters (loadtests/bench/lifecycle.py) as real `cornus serve` processes."""

from __future__ import annotations

import socket

import pytest

from cornus.protocol.config import Protocol
from loadtests.bench import lifecycle
from services import local_cluster
from storage_adapters.factory import StoreConfig


# The gRPC port is the one the suite saw taken; a peer port changes every node's peers list.
@pytest.mark.parametrize("taken", ["grpc", "peer"])
def test_a_cluster_whose_port_was_taken_before_its_node_bound_it_starts_on_other_ports(monkeypatch, taken):
    """Found by the suite (fresh-clone CI, 2026-11-27): two benches of parallel test workers draw
    ports from one range, and a port one picked (probed free, then let go) was taken by the other
    before the node bound it; the bench failed. A node that cannot bind exits with
    EXIT_CODE_ADDRESS_UNBOUND having taken nothing, and the cluster starts again on other ports."""
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    busy_port = busy.getsockname()[1]
    picks = []
    pick = local_cluster.cluster_ports

    def first_pick_collides(node_count: int, base_port: int | None) -> list[tuple[int, int, int]]:
        ports = pick(node_count, base_port)
        if not picks:  # node 1's port is taken between the pick and its bind
            api, peer, public = ports[1]
            ports[1] = {"api": (busy_port, peer, public), "peer": (api, busy_port, public),
                        "grpc": (api, peer, busy_port)}[taken]
        picks.append(ports)
        return ports

    monkeypatch.setattr(local_cluster, "cluster_ports", first_pick_collides)
    spec = lifecycle.ClusterSpec(nodes=2, partitions=2, protocol=Protocol.CORNUS, storage=StoreConfig(),
                                 storage_argv=["--backend", "emulator"])
    try:
        with lifecycle.bench_cluster(spec) as cluster:
            members = list(cluster.members)  # as the termination bench holds them, before the start
            cluster.start()
            assert len(picks) == 2, picks
            assert [id(node) for node in cluster.members] == [id(node) for node in members]
            assert all(node.alive for node in members)
            ports = {port for node in members for port in (
                node.api_port, node.peer_port, int(node.config.grpc_api_listen.rsplit(":", 1)[1]))}
            assert busy_port not in ports and len(ports) == 3 * len(members), ports
            assert all(f":{node.peer_port}" in cluster.peers for node in members), cluster.peers
    finally:
        busy.close()
