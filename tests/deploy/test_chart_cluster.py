"""The rendered chart starts a working cluster.

The chart is rendered for a 3-replica Redis install, twice: with the Redis a user runs (its URL in a
Secret) and with the chart's own dev Redis (the default install). Each pod of the StatefulSet
becomes a local process run with exactly the container's command, args and environment (fieldRefs
resolved to the pod, secretKeyRefs to the Secret a user would create, holding this xdist worker's
Redis database; the dev Redis's in-cluster address to the test Redis; the peer TLS Secret's volume,
in the `redis` install, to a directory holding a throwaway CA's certificate for the pods under the
Secret's keys), from an empty working directory as in the image. Every in-cluster DNS name the
manifests use (each pod's name under the headless Service, the client Service) and the pods' own
listen address map to 127.0.0.1 ports, one per (pod, container port). The test waits for each pod's
rendered readiness probe, commits a transaction that spans partitions held by different nodes
through the client Service's REST port and another through its public gRPC port, reads both back,
runs the `helm test` hook's script and the rebalance hook's command as written, runs the rebalance
hook of a 5-replica render against the three pods (it must fail: two nodes are missing, three run
the old node set), and stops the pods with SIGTERM within the rendered grace period. A chart whose
variables, ports, peer list or probes are wired wrong fails here.

The image's entrypoint `cornus` (checked equal to the Dockerfile's in test_dockerfile.py) runs as
`python -m services.cli` from this checkout.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from cornus.runtime.keys import partition_of
from loadtests.bench.tls_certs import ThrowawayCa
from services.public_api._generated import public_pb2 as pb
from services.public_api._generated import public_pb2_grpc
from services.public_api.example import parse_ops
from tests.cluster.conftest import storage_for
from tests.conftest import Services
from tests.deploy.conftest import NAMESPACE, REPO, VALUES_FILES, find, render
from tests.worker import free_port

REPLICA_COUNT = 3
# The scale-up whose rebalance hook runs against the three pods before any new pod exists.
SCALED_REPLICA_COUNT = 5
READY_TIMEOUT_S = 60.0
POLL_S = 0.05
HTTP_TIMEOUT_S = 15.0
GRPC_TIMEOUT_S = 15.0
HOOK_TIMEOUT_S = 120.0
# The wait given to the 5-replica rebalance hook, which can never be satisfied here: long enough
# for a few rounds of asking the nodes, short enough to keep the test quick.
UNSATISFIABLE_HOOK_WAIT_S = 2.0
LOG_TAIL_BYTES_MAX = 4_000
# Values a test may set beyond the Redis example's: the replica count the issue asks for, and
# the shorter storage deadline and clock slack of every cluster test on one machine (see
# tests/cluster/harness.py), which also shorten the recovery wait before each pod is ready; and
# no wait for the collections at a pod's stop, the storage being thrown away after the test.
TEST_SETS = [f"replicaCount={REPLICA_COUNT}", "storage.timeoutMsCall=2000", "timeouts.clock_slack_ms=250",
             "timeouts.timeout_ms_stop_collect=0"]
# The Secret the `redis` install's peerTls names (a user's cert-manager Certificate would write it).
PEER_TLS_SECRET = "cornus-peer-tls"
_ADDRESS = re.compile(r"(?P<host>[A-Za-z0-9.\-]+):(?P<port>\d{1,5})")


@dataclass
class Pod:
    name: str
    ports: dict[int, int]  # container port -> 127.0.0.1 port
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    def log_tail(self) -> str:
        assert self.log_path is not None
        return self.log_path.read_bytes()[-LOG_TAIL_BYTES_MAX:].decode("utf-8", "replace")


class LocalNetwork:
    """In-cluster addresses to loopback ones: <pod>.<headless service>.<ns>.svc.<domain>:<port> to
    that pod's port, <service>.<ns>.svc.<domain>:<port> to the targetPort of the Service's first
    endpoint, and the pod's own listen host to its loopback port."""

    def __init__(self, pods: Mapping[str, Pod], peer_service: str, domain: str, listen_host: str,
                 services: Mapping[str, dict[int, int]]) -> None:
        self.pod_hosts = {f"{pod}.{peer_service}.{NAMESPACE}.svc.{domain}": pod for pod in pods}
        self.service_hosts = {f"{name}.{NAMESPACE}.svc.{domain}": ports for name, ports in services.items()}
        self.pods = pods
        self.listen_host = listen_host

    def rewrite(self, text: str, pod: str | None) -> str:
        def local(match: re.Match[str]) -> str:
            host, port = match["host"], int(match["port"])
            if host in self.pod_hosts:
                return f"127.0.0.1:{self.pods[self.pod_hosts[host]].ports[port]}"
            if host in self.service_hosts:
                target = self.service_hosts[host][port]
                return f"127.0.0.1:{next(iter(self.pods.values())).ports[target]}"
            if host == self.listen_host:
                assert pod is not None, f"{match[0]} outside a pod"
                return f"127.0.0.1:{self.pods[pod].ports[port]}"
            return match[0]

        return _ADDRESS.sub(local, text)


def container_port(container: dict[str, Any], name_or_number: str | int) -> int:
    if isinstance(name_or_number, int):
        return name_or_number
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name_or_number]
    return int(port)


def resolve_env(container: dict[str, Any], pod: str, secrets: Mapping[tuple[str, str], str]) -> dict[str, str]:
    environ: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            environ[item["name"]] = item["value"]
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            assert path in ("metadata.name", "metadata.namespace"), f"{item['name']}: fieldRef {path} not emulated"
            environ[item["name"]] = pod if path == "metadata.name" else NAMESPACE
        else:
            ref = source["secretKeyRef"]
            assert (ref["name"], ref["key"]) in secrets, f"{item['name']}: no Secret {ref['name']} key {ref['key']}"
            environ[item["name"]] = secrets[(ref["name"], ref["key"])]
    return environ


def local_argv(command: list[str], args: list[str]) -> list[str]:
    """The container's command: `cornus` is the image's console script, services.cli:main."""
    if command[0] == "cornus":
        return [sys.executable, "-m", "services.cli", *command[1:], *args]
    return [*command, *args]


def base_environ(tmp_path: Path) -> dict[str, str]:
    """What the image provides besides the manifest's env: the code, a PATH with `cornus` on it,
    HOME=/tmp. Nothing of this process's CORNUS_* settings leaks into the pods."""
    shim_dir = tmp_path / "bin"
    shim_dir.mkdir(exist_ok=True)
    shim = shim_dir / "cornus"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m services.cli "$@"\n')
    shim.chmod(0o755)
    return {"PATH": f"{shim_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO), "HOME": str(tmp_path),
            "LANG": "C.UTF-8"}


@contextlib.contextmanager
def running(pods: Mapping[str, Pod], grace_s: float, workdir: Path) -> Iterator[None]:
    try:
        for pod in pods.values():
            assert pod.log_path is not None
            with pod.log_path.open("ab") as log:
                pod.process = subprocess.Popen(pod.argv, env=pod.env, cwd=workdir, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True)
        yield
    finally:
        for pod in pods.values():
            if pod.process is not None and pod.process.poll() is None:
                pod.process.send_signal(signal.SIGTERM)
        for pod in pods.values():
            if pod.process is None:
                continue
            try:
                pod.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                # What the kubelet does after terminationGracePeriodSeconds.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pod.process.pid, signal.SIGKILL)
                pod.process.wait()


def wait_ready(client: httpx.Client, pod: Pod, url: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        assert pod.process is not None
        if pod.process.poll() is not None:
            pytest.fail(f"{pod.name} exited with {pod.process.returncode}:\n{pod.log_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if client.get(url, timeout=1.0).status_code == 200:
                return
        time.sleep(POLL_S)
    pytest.fail(f"{pod.name}: readiness probe {url} not 200 within {READY_TIMEOUT_S:g} s:\n{pod.log_tail()}")


def run_hook(argv: list[str], env: dict[str, str], workdir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, cwd=workdir, capture_output=True, text=True, timeout=HOOK_TIMEOUT_S,
                          check=False)


def hook_output(done: subprocess.CompletedProcess[str], what: str) -> str:
    assert done.returncode == 0, f"{what} failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def rebalance_hook(docs: list[dict[str, Any]], network: LocalNetwork, secrets: Mapping[tuple[str, str], str],
                   base: Mapping[str, str], wait_s: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The rebalance hook's command and environment as rendered (its Secrets those of the running
    release), its addresses mapped; `wait_s` replaces its wait."""
    job = find(docs, "Job", "cornus-rebalance")
    assert "post-upgrade" in job["metadata"]["annotations"]["helm.sh/hook"]
    (job_container,) = job["spec"]["template"]["spec"]["containers"]
    args = [network.rewrite(arg, None) for arg in job_container["args"]]
    if wait_s is not None:
        args[args.index("--timeout-s") + 1] = wait_s
    env = {**base, **{n: network.rewrite(v, None) for n, v in resolve_env(job_container, "", secrets).items()}}
    return local_argv(job_container["command"], args), env


def tls_files(tmp_path: Path, peer_service: dict[str, Any], domain: str) -> dict[str, dict[str, bytes]]:
    """The Secret a user creates for peerTls (as cert-manager writes it: tls.crt, tls.key,
    ca.crt): one certificate for every pod, naming the pods' DNS names under the headless Service
    (what values.yaml asks for) and 127.0.0.1, where the test's network maps them."""
    ca = ThrowawayCa(tmp_path / "ca")
    wildcard = f"*.{peer_service['metadata']['name']}.{NAMESPACE}.svc.{domain}"
    files = ca.issue("cornus-peers", hosts=(wildcard, "127.0.0.1"))
    keys = {"tls.crt": files.cert_file, "tls.key": files.key_file, "ca.crt": files.ca_file}
    return {PEER_TLS_SECRET: {key: Path(path).read_bytes() for key, path in keys.items()}}


def secret_mounts(pod_spec: dict[str, Any], container: dict[str, Any], root: Path,
                  secrets: Mapping[str, Mapping[str, bytes]]) -> dict[str, Path]:
    """Each Secret volume the container mounts, written under `root` as the kubelet would (a file
    per key), as {mountPath: local directory}."""
    volumes = {volume["name"]: volume for volume in pod_spec["volumes"]}
    mounts: dict[str, Path] = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "secret" not in volume:
            continue
        name = volume["secret"]["secretName"]
        assert name in secrets, f"volume {mount['name']}: no Secret {name} in this test"
        directory = root / mount["name"]
        directory.mkdir(parents=True)
        for key, data in secrets[name].items():
            (directory / key).write_bytes(data)
        mounts[mount["mountPath"]] = directory
    return mounts


def mounted(value: str, mounts: Mapping[str, Path]) -> str:
    """A path under a mounted Secret's mountPath, to where the test wrote it."""
    for mount_path, directory in mounts.items():
        if value.startswith(mount_path + "/"):
            return str(directory / value.removeprefix(mount_path + "/"))
    return value


def dev_redis_address(docs: list[dict[str, Any]], domain: str) -> str:
    """host:port of the dev Redis's one pod by its stable name: pod 0 of the rendered StatefulSet
    under the headless Service that governs it, on the port its container listens on."""
    (statefulset,) = [doc for doc in docs if doc["kind"] == "StatefulSet"
                      and doc["metadata"]["labels"].get("app.kubernetes.io/component") == "dev-redis"]
    name = statefulset["metadata"]["name"]
    service = find(docs, "Service", statefulset["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None", "the dev Redis pod's own DNS name needs a headless Service"
    (redis,) = statefulset["spec"]["template"]["spec"]["containers"]
    port = container_port(redis, "redis")
    assert [p["port"] for p in service["spec"]["ports"]] == [port]
    return f"{name}-0.{service['metadata']['name']}.{NAMESPACE}.svc.{domain}:{port}"


def keys_on_every_node(owners: Mapping[str, str], partition_count: int, prefix: str, node_count: int) -> dict[str, str]:
    """One key per node (node -> key): a transaction over them has a participant on every node."""
    keys: dict[str, str] = {}
    for index in range(10_000):
        key = f"{prefix}-{index}"
        keys.setdefault(owners[partition_of(key, partition_count)], key)
        if len(keys) == node_count:
            return keys
    raise AssertionError(f"no key of {prefix} lands on every one of {node_count} nodes")


@pytest.mark.services
@pytest.mark.parametrize("install", ["redis", "dev_redis"])
def test_rendered_chart_starts_a_cluster_that_commits(helm_bin: str, services: Services, tmp_path: Path,
                                                      install: str) -> None:
    # The install with the user's own Redis is a production one: its peers speak mutual TLS.
    tls_sets = ["peerTls.enabled=true", f"peerTls.secretName={PEER_TLS_SECRET}"] if install == "redis" else []
    docs = render(helm_bin, VALUES_FILES[install], [*TEST_SETS, *tls_sets])
    statefulset = find(docs, "StatefulSet", "cornus")
    pod_spec = statefulset["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    replicas = statefulset["spec"]["replicas"]
    assert replicas == REPLICA_COUNT
    peer_service = find(docs, "Service", statefulset["spec"]["serviceName"])
    assert peer_service["spec"]["clusterIP"] == "None", "the peer Service must be headless"
    client_service = find(docs, "Service", "cornus")
    env_values = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    listen_host = env_values["CORNUS_LISTEN"].rsplit(":", 1)[0]
    domain = env_values["CORNUS_PEERS"].split(",")[0].split(f".{NAMESPACE}.svc.", 1)[1].rsplit(":", 1)[0]

    # Each pod's container ports get loopback ports of this xdist worker; so do the pods of the
    # 5-replica render, which never start (their ports refuse connections, as a pod that does not
    # exist yet is unreachable).
    pods = {f"cornus-{i}": Pod(f"cornus-{i}", {int(p["containerPort"]): free_port() for p in container["ports"]})
            for i in range(SCALED_REPLICA_COUNT)}
    running_pods = {name: pods[name] for name in sorted(pods)[:replicas]}
    services_ports = {
        service["metadata"]["name"]: {int(p["port"]): container_port(container, p["targetPort"])
                                      for p in service["spec"]["ports"]}
        for service in (client_service, peer_service)
    }
    network = LocalNetwork(pods, peer_service["metadata"]["name"], domain, listen_host, services_ports)
    # This worker's emptied database: in the Secret a user creates for ci/redis-values.yaml, or
    # where the default install's URL points, the dev Redis pod of the release.
    redis_url = storage_for("redis", services, tmp_path)["redis_url"]
    # And the admin token's Secret, as the chart made it (a random token).
    admin_token = base64.b64decode(find(docs, "Secret", "cornus-admin")["data"]["admin-token"]).decode()
    secrets = {("cornus-redis", "redis-url"): redis_url, ("cornus-admin", "admin-token"): admin_token}
    base = base_environ(tmp_path)
    # An empty working directory, as the image's (/var/lib/cornus, on a read-only root filesystem):
    # nothing may depend on running from the repository, and nothing is written there.
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    mounts = secret_mounts(pod_spec, container, tmp_path / "secrets", tls_files(tmp_path, peer_service, domain))
    assert bool(mounts) == bool(tls_sets), mounts
    for pod in running_pods.values():
        environ = resolve_env(container, pod.name, secrets)
        pod.env = {**base, **{name: mounted(network.rewrite(value, pod.name), mounts)
                              for name, value in environ.items()}}
        if install == "dev_redis":
            assert pod.env["CORNUS_STORAGE_REDIS_URL"] == f"redis://{dev_redis_address(docs, domain)}/0"
            pod.env["CORNUS_STORAGE_REDIS_URL"] = redis_url
        pod.argv = local_argv(container["command"], container.get("args", []))
        pod.log_path = tmp_path / f"{pod.name}.log"
    if tls_sets:
        assert Path(pods["cornus-0"].env["CORNUS_PEER_TLS_KEY_FILE"]).read_bytes().startswith(b"-----BEGIN PRIVATE KEY")
    assert all(address.startswith("127.0.0.1:") for address in
               [pods["cornus-0"].env["CORNUS_LISTEN"], pods["cornus-0"].env["CORNUS_API_LISTEN"]])

    def probe_url(pod: Pod, probe: dict[str, Any]) -> str:
        get = probe["httpGet"]
        return f"http://127.0.0.1:{pod.ports[container_port(container, get['port'])]}{get['path']}"

    grace_s = float(pod_spec["terminationGracePeriodSeconds"])
    with running(running_pods, grace_s, workdir), httpx.Client(timeout=HTTP_TIMEOUT_S) as http:
        for pod in running_pods.values():
            wait_ready(http, pod, probe_url(pod, container["readinessProbe"]))
            assert http.get(probe_url(pod, container["livenessProbe"])).status_code == 200
            assert http.get(probe_url(pod, container["startupProbe"])).status_code == 200

        # Through the client Service: its http port, by targetPort, to a node's REST port.
        service_port = next(p["port"] for p in client_service["spec"]["ports"] if p["name"] == "http")
        service_url = "http://" + network.rewrite(f"cornus.{NAMESPACE}.svc.{domain}:{service_port}", None)

        # The admin endpoints take the release's token, and only it.
        listing = f"{service_url}/v1/admin/transactions"
        assert http.get(listing).status_code == 401
        assert http.get(listing, headers={"Authorization": f"Bearer {admin_token}"}).status_code == 200

        # Every partition is held by its preferred node, the pods sorted by name, round-robin. The
        # listing names the peer port's addresses: it takes the token too (found by audit,
        # 2026-11-28, second: it answered every client of the API).
        assert http.get(f"{service_url}/v1/partitions").status_code == 401
        partitions = http.get(f"{service_url}/v1/partitions",
                              headers={"Authorization": f"Bearer {admin_token}"}).json()["partitions"]
        owners = {row["partition"]: row["owner"] for row in partitions}
        partition_count = int(env_values["CORNUS_PARTITION_COUNT"])
        assert owners == {f"p{i}": sorted(running_pods)[i % replicas] for i in range(partition_count)}

        # One key per node: a transaction whose participants are on every node.
        keys = keys_on_every_node(owners, partition_count, "deploy-test", replicas)
        ops = [{"op": "put", "key": key, "value": f"v-{owner}"} for owner, key in keys.items()]
        committed = http.post(f"{service_url}/v1/execute", json={"ops": ops})
        assert committed.status_code == 200, committed.text
        assert committed.json()["outcome"] == "committed", committed.text
        # Read back, from every node, each in a transaction of its own.
        for pod in running_pods.values():
            url = f"http://127.0.0.1:{pod.ports[container_port(container, 'http')]}"
            read = http.post(f"{url}/v1/execute", json={"ops": [{"op": "get", "key": key} for key in keys.values()]})
            assert read.status_code == 200, read.text
            assert read.json()["reads"] == {key: f"v-{owner}" for owner, key in keys.items()}

        # Through the client Service's grpc port, with the project's gRPC client (the generated
        # stubs of services/public_api): another transaction on every node, then read back.
        grpc_port = next(p["port"] for p in client_service["spec"]["ports"] if p["name"] == "grpc")
        target = network.rewrite(f"cornus.{NAMESPACE}.svc.{domain}:{grpc_port}", None)
        grpc_keys = keys_on_every_node(owners, partition_count, "deploy-grpc", replicas)
        with grpc.insecure_channel(target) as channel:
            stub = public_pb2_grpc.CornusStub(channel)
            words = [word for owner, key in grpc_keys.items() for word in ("put", key, f"g-{owner}")]
            outcome = stub.Execute(pb.ExecuteRequest(ops=parse_ops(words)), timeout=GRPC_TIMEOUT_S)
            assert outcome.outcome == pb.OUTCOME_COMMITTED, str(outcome)
            words = [word for key in grpc_keys.values() for word in ("get", key)]
            read_back = stub.Execute(pb.ExecuteRequest(ops=parse_ops(words)), timeout=GRPC_TIMEOUT_S)
            assert read_back.outcome == pb.OUTCOME_COMMITTED, str(read_back)
            assert {read.key: read.value.decode() for read in read_back.reads} == {
                key: f"g-{owner}" for owner, key in grpc_keys.items()}

        # The `helm test` hook, as rendered: its script, its environment, the client Service.
        hook = find(docs, "Pod", "cornus-test-commit")
        assert hook["metadata"]["annotations"]["helm.sh/hook"] == "test"
        (hook_container,) = hook["spec"]["containers"]
        hook_env = {**base, **{n: network.rewrite(v, None) for n, v in resolve_env(hook_container, "", {}).items()}}
        output = hook_output(run_hook(local_argv(hook_container["command"], hook_container["args"]), hook_env,
                                      workdir), "helm test hook")
        assert output.count("committed") == 2, output
        # It leaves nothing in the user's storage: every key it wrote is gone (each revision's
        # test wrote eight keys that stayed for good, found by review).
        prefix = hook_env["CORNUS_TEST_KEY_PREFIX"]
        absent = [sys.executable, "-m", "services.cli", "txn", "--url", hook_env["CORNUS_TEST_URL"],
                  *(f"check:{prefix}{index}" for index in range(8))]
        assert "committed" in hook_output(run_hook(absent, hook_env, workdir), "the hook's keys are gone")

        # The post-install/post-upgrade rebalance hook, as rendered: every node answers with the
        # rendered node set and every partition is on its preferred node, so it exits 0. Its
        # environment is the rendered one: the listing it asks for takes the admin token.
        hook_output(run_hook(*rebalance_hook(docs, network, secrets, base), workdir), "rebalance hook")

        # The hook of an upgrade to five replicas, run before any pod has rolled (`helm upgrade`
        # without --wait): cornus-3 and cornus-4 do not exist and the three pods still run the
        # 3-node set. Each node's own view says "placed"; the hook must not believe it.
        five = render(helm_bin, VALUES_FILES[install], [*TEST_SETS, f"replicaCount={SCALED_REPLICA_COUNT}"])
        refused = run_hook(*rebalance_hook(five, network, secrets, base, f"{UNSATISFIABLE_HOOK_WAIT_S:g}"), workdir)
        assert refused.returncode == 1, f"the 5-replica hook passed with 3 pods:\n{refused.stdout}{refused.stderr}"
        three_set, five_set = ",".join(sorted(running_pods)), ",".join(sorted(pods))
        for name in sorted(pods):
            why = "no answer" if name not in running_pods else f"runs with the node set {three_set}, not {five_set}"
            assert f"node {name}: {why}" in refused.stderr, refused.stderr

    # SIGTERM ended every pod cleanly within the rendered terminationGracePeriodSeconds.
    for pod in running_pods.values():
        assert pod.process is not None
        assert pod.process.returncode == 0, f"{pod.name} exited with {pod.process.returncode}:\n{pod.log_tail()}"
    assert not list(workdir.iterdir()), f"written to the working directory: {sorted(workdir.iterdir())}"
