"""A cluster of `cornus serve` processes whose peer port speaks mutual TLS
(cornus.runtime.peer_tls): it commits distributed transactions, and a node that shows no
certificate of the cluster's CA never joins them.

Found by audit (2026-11-27): the peer port took any connection that sent a hello; these tests
failed on the code before TLS, which did not know the settings.
"""

from __future__ import annotations

import socket
import ssl
import time
from pathlib import Path

import pytest

from cornus.runtime.config import load_node_config
from loadtests.bench.tls_certs import ThrowawayCa
from services.node_rpc._generated import node_pb2 as pb
from storage_adapters.errors import ValidationError
from tests.cluster.conftest import storage_for
from tests.cluster.harness import keys_on, running_cluster
from tests.conftest import Services

SOCKET_TIMEOUT_S = 10.0
OWNERS_WAIT_S = 30.0
POLL_S = 0.05


def test_a_tls_cluster_commits_and_a_plain_connection_to_its_peer_port_gets_no_answer(
    services: Services, tmp_path: Path,
) -> None:
    ca = ThrowawayCa(tmp_path / "ca")
    with running_cluster("cornus", storage_for("emulator", services, tmp_path)) as cluster:
        for node in cluster.nodes.values():
            node.env.update(ca.issue(node.node_id).environ())
        cluster.start_all()
        keys = [keys_on(f"p{i}", 6, 1, prefix="t")[0] for i in range(6)]  # every node a participant
        response = cluster.execute("n0", [{"op": "put", "key": k, "value": f"v-{k}"} for k in keys])
        assert response.status_code == 200 and response.json()["outcome"] == "committed", response.text
        assert cluster.read("n2", keys) == {k: f"v-{k}" for k in keys}

        # A probe without TLS (a hello and a status request, as a tool would send) gets no frame back.
        frame = pb.PeerFrame(sender="probe")
        frame.items.add(kind=pb.ENVELOPE_KIND_REQUEST, correlation_id=1, timeout_ms=1_000).status_request.SetInParent()
        data = frame.SerializeToString()
        with socket.create_connection(("127.0.0.1", cluster.nodes["n1"].peer_port), SOCKET_TIMEOUT_S) as probe:
            probe.settimeout(SOCKET_TIMEOUT_S)
            probe.sendall(len(data).to_bytes(4, "big") + data)
            answer = b""
            while chunk := probe.recv(4096):
                answer += chunk
        assert answer[:1] != b"\x00", f"a frame answered a connection without TLS: {answer[:40]!r}"

        # The same probe over TLS with a certificate of the CA is answered: the refusal above was TLS's.
        files = ca.issue("probe")
        context = ssl.create_default_context(cafile=files.ca_file)
        context.load_cert_chain(files.cert_file, files.key_file)
        with socket.create_connection(("127.0.0.1", cluster.nodes["n1"].peer_port), SOCKET_TIMEOUT_S) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as probe:
            probe.settimeout(SOCKET_TIMEOUT_S)
            probe.sendall(len(data).to_bytes(4, "big") + data)
            frames: list[pb.PeerFrame] = []
            buffer = b""
            while len(frames) < 2:  # its hello, then the answer
                buffer += probe.recv(65536)
                while len(buffer) >= 4 and len(buffer) >= 4 + (size := int.from_bytes(buffer[:4], "big")):
                    if size:
                        frames.append(pb.PeerFrame.FromString(buffer[4:4 + size]))
                    buffer = buffer[4 + size:]
        assert frames[0].sender == "n1"
        assert frames[1].items[0].status_response.node == "n1"


def test_a_node_with_a_certificate_of_another_ca_never_joins(services: Services, tmp_path: Path) -> None:
    ca, stranger = ThrowawayCa(tmp_path / "ca"), ThrowawayCa(tmp_path / "other", name="other-ca")
    with running_cluster("cornus", storage_for("emulator", services, tmp_path), node_count=2,
                         partition_count=2) as cluster:
        cluster.nodes["n0"].env.update(ca.issue("n0").environ())
        cluster.nodes["n1"].env.update(stranger.issue("n1").environ())
        cluster.start_all()
        # n0 owns p0, n1 owns p1 (round-robin) once each took its own: a transaction over both
        # then needs the link. (Ready does not wait for that: n0 may hold both for a moment.)
        deadline_s = time.monotonic() + OWNERS_WAIT_S
        while {row["partition"]: row["owner"] for row in cluster.get("n0", "/v1/partitions").json()[
                "partitions"]} != {"p0": "n0", "p1": "n1"}:
            assert time.monotonic() < deadline_s, "the partitions did not reach their preferred owners"
            time.sleep(POLL_S)
        keys = [keys_on("p0", 2, 1, prefix="s")[0], keys_on("p1", 2, 1, prefix="s")[0]]
        response = cluster.execute("n0", [{"op": "put", "key": k, "value": "x"} for k in keys])
        assert response.status_code != 200 or response.json()["outcome"] != "committed", response.text
        assert "certificate" in cluster.log("n0").lower() or "certificate" in cluster.log("n1").lower()


def test_the_settings_come_from_file_environment_or_flags_and_bad_ones_are_refused(tmp_path: Path) -> None:
    files = ThrowawayCa(tmp_path / "ca").issue("n0")
    base = {"node_id": "n0", "peers": "n0=127.0.0.1:7100", "partition_count": 1}
    assert load_node_config(environ={}, overrides=base).peer_tls is None
    from_env = load_node_config(environ=files.environ(), overrides=base).peer_tls
    assert from_env is not None and from_env.ca_file == files.ca_file and from_env.verify_hostname
    config_file = tmp_path / "node.toml"
    config_file.write_text(f'[peer_tls]\ncert_file = "{files.cert_file}"\nkey_file = "{files.key_file}"\n'
                           f'ca_file = "{files.ca_file}"\nverify_hostname = false\n')
    from_file = load_node_config(config_file, environ={}, overrides=base).peer_tls
    assert from_file is not None and not from_file.verify_hostname
    flagged = load_node_config(config_file, environ={"CORNUS_PEER_TLS_VERIFY_HOSTNAME": "false"},
                               overrides={**base, "peer_tls_verify_hostname": "true"}).peer_tls
    assert flagged is not None and flagged.verify_hostname

    with pytest.raises(ValidationError, match="peer_tls needs key_file, ca_file"):
        load_node_config(environ={"CORNUS_PEER_TLS_CERT_FILE": files.cert_file}, overrides=base)
    with pytest.raises(ValidationError, match=r"missing\.key"):
        load_node_config(environ={**files.environ(), "CORNUS_PEER_TLS_KEY_FILE": str(tmp_path / "missing.key")},
                         overrides=base)
    with pytest.raises(ValidationError, match="verify_hostname must be true or false"):
        load_node_config(environ={**files.environ(), "CORNUS_PEER_TLS_VERIFY_HOSTNAME": "maybe"}, overrides=base)
    config_file.write_text('[peer_tls]\ncert = "x"\n')
    with pytest.raises(ValidationError, match="unknown peer_tls settings: cert"):
        load_node_config(config_file, environ={}, overrides=base)
