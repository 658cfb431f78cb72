"""The Helm chart, checked offline: `helm lint --strict` and `helm template` with each backend's
values file, the rendered manifests against the Kubernetes schemas of two minor versions
(`kubernetes-validate --strict`), checkov on the chart and on the rendered manifests, the refusals
of values.schema.json and of the templates, and the rendered configuration of every pod loaded by
the node's own config loader, so a variable the node does not know fails here rather than in a
crash-looping pod. (tests/deploy/test_chart_cluster.py starts the rendered pods as processes.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cornus.runtime.config import load_node_config, timeout_names_all
from services.serve import SHUTDOWN_TIMEOUT_S, STORAGE_OPEN_TIMEOUT_S
from tests.deploy.conftest import CHART, VALUES_FILES, find, render, render_error, run_helm

# Two supported minor versions, the oldest and a recent one that AKS and EKS both offer.
KUBERNETES_VERSIONS = ("1.29.0", "1.33.0")
CHECKOV_TIMEOUT_S = 300.0
VALIDATE_TIMEOUT_S = 120.0
# An image digest for renders that must pin one (the defaults cannot: no image is published).
DIGEST = "sha256:" + "ab" * 32
# The dummy value every secretKeyRef resolves to when a rendered config is loaded in-process.
SECRET_VALUES = {
    ("cornus-redis", "redis-url"): "redis://:password@redis.example.internal:6380/0",
    ("cornus-azure-blob", "connection-string"): (
        "DefaultEndpointsProtocol=https;AccountName=cornus;AccountKey=a2V5;EndpointSuffix=core.windows.net"
    ),
}


def node_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec = find(docs, "StatefulSet", "cornus")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return container


def pod_environ(container: dict[str, Any], pod: str) -> dict[str, str]:
    """The environment Kubernetes would give `pod`, with secrets from SECRET_VALUES."""
    environ: dict[str, str] = {}
    for item in container["env"]:
        if "value" in item:
            environ[item["name"]] = item["value"]
        elif "fieldRef" in item["valueFrom"]:
            assert item["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", item
            environ[item["name"]] = pod
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            environ[item["name"]] = SECRET_VALUES[(ref["name"], ref["key"])]
    return environ


@pytest.mark.parametrize("values", sorted(VALUES_FILES))
def test_lint_strict(helm_bin: str, values: str) -> None:
    done = run_helm(helm_bin, ["lint", "--strict", str(CHART), "-f", str(VALUES_FILES[values])])
    assert done.returncode == 0, done.stdout + done.stderr


def test_lint_strict_defaults(helm_bin: str) -> None:
    done = run_helm(helm_bin, ["lint", "--strict", str(CHART)])
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("values", sorted(VALUES_FILES))
def test_template_gives_every_pod_a_config_the_node_accepts(helm_bin: str, values: str) -> None:
    docs = render(helm_bin, VALUES_FILES[values])
    statefulset = find(docs, "StatefulSet", "cornus")
    container = node_container(docs)
    replicas = statefulset["spec"]["replicas"]
    for ordinal in range(replicas):
        pod = f"cornus-{ordinal}"
        config = load_node_config(environ=pod_environ(container, pod))
        assert config.node_id == pod
        assert sorted(config.peers) == [f"cornus-{i}" for i in range(replicas)]
        expected_backend = "redis" if values == "dev_redis" else values
        assert config.storage.backend == expected_backend
        assert config.lock_policy.value == "no_wait"
    # Storage credentials only by reference: no literal value of a credential variable.
    for item in container["env"]:
        if item["name"] in ("CORNUS_STORAGE_AZURE_CONNECTION_STRING", "AWS_SECRET_ACCESS_KEY"):
            assert "secretKeyRef" in item["valueFrom"], item
        if item["name"] == "CORNUS_STORAGE_REDIS_URL" and "value" in item:
            assert "@" not in item["value"], "a Redis URL with credentials must come from a Secret"


def test_template_wires_backend_specific_settings(helm_bin: str) -> None:
    redis = {e["name"]: e for e in node_container(render(helm_bin, VALUES_FILES["redis"]))["env"]}
    secret_ref = redis["CORNUS_STORAGE_REDIS_URL"]["valueFrom"]["secretKeyRef"]
    assert secret_ref == {"name": "cornus-redis", "key": "redis-url"}
    dynamodb_docs = render(helm_bin, VALUES_FILES["dynamodb"])
    account = find(dynamodb_docs, "ServiceAccount", "cornus")
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")
    assert not any(e["name"].startswith("AWS_") for e in node_container(dynamodb_docs)["env"]), "IRSA needs no keys"
    emulator_docs = render(helm_bin, VALUES_FILES["emulator"])
    claims = find(emulator_docs, "StatefulSet", "cornus")["spec"]["volumeClaimTemplates"]
    assert [claim["metadata"]["name"] for claim in claims] == ["data"]
    dev = render(helm_bin, VALUES_FILES["dev_redis"])
    redis_args = find(dev, "StatefulSet", "cornus-redis")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert redis_args[redis_args.index("--appendonly") + 1] == "yes"
    assert redis_args[redis_args.index("--appendfsync") + 1] == "always"
    assert find(dev, "StatefulSet", "cornus-redis")["spec"]["volumeClaimTemplates"]
    assert find(dev, "ServiceMonitor", "cornus")["spec"]["endpoints"] == [
        {"port": "http", "path": "/metrics", "interval": "30s"}]


def test_probes_and_grace_period_fit_the_node(helm_bin: str) -> None:
    docs = render(helm_bin, VALUES_FILES["redis"])
    pod_spec = find(docs, "StatefulSet", "cornus")["spec"]["template"]["spec"]
    container = node_container(docs)
    # SIGTERM: up to SHUTDOWN_TIMEOUT_S for the APIs, then up to as long again to stop the node.
    assert pod_spec["terminationGracePeriodSeconds"] > 2 * SHUTDOWN_TIMEOUT_S
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] > STORAGE_OPEN_TIMEOUT_S
    assert startup["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert security["capabilities"]["drop"] == ["ALL"]
    assert pod_spec["securityContext"]["runAsNonRoot"]
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    budget = find(docs, "PodDisruptionBudget", "cornus")["spec"]
    assert budget["maxUnavailable"] == 1


def test_partition_count_is_in_the_immutable_selector(helm_bin: str) -> None:
    """A StatefulSet selector cannot change: the API server refuses an upgrade that changes the
    partition count even when the chart is rendered offline (where lookup sees nothing)."""
    docs = render(helm_bin, VALUES_FILES["redis"], ["partitionCount=24"])
    selector = find(docs, "StatefulSet", "cornus")["spec"]["selector"]["matchLabels"]
    assert selector["cornus.dev/partition-count"] == "24"
    env = {e["name"]: e.get("value") for e in node_container(docs)["env"]}
    assert env["CORNUS_PARTITION_COUNT"] == "24"


def test_schema_timeouts_are_the_nodes() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    names = set(schema["properties"]["timeouts"]["propertyNames"]["enum"])
    # storage_deadline_ms is set through storage.timeoutMsCall (the node refuses it on its own).
    assert names == timeout_names_all() - {"storage_deadline_ms"}


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["replicaCount=0"], "replicaCount"),
        (["protocol=3pc"], "protocol"),
        (["timeouts.timeout_ms_prepere=400"], "timeout_ms_prepere"),
        (["terminationGracePeriodSeconds=10"], "terminationGracePeriodSeconds"),
        (["storage.redis.url=redis://:secret@redis:6379/0", "storage.redis.existingSecret="], "url"),
        (["storage.backend=emulator", "replicaCount=3"], "replicaCount"),
        (["replicaCount=13"], "replicaCount (13) exceeds partitionCount (12)"),
        (["storage.backend=azure_blob", "storage.azureBlob.existingSecret="], "needs storage.azureBlob.existingSecret"),
        (["storage.backend=dynamodb", "devRedis.enabled=true"], "devRedis.enabled=true needs storage.backend=redis"),
        (["storage.redis.existingSecret="], "storage.backend=redis needs storage.redis.existingSecret"),
        (["image.digest=latest"], "digest"),
        (["listenHost=::"], "listenHost"),
        (["lockPolicy=wound_wait"], "lockPolicy"),
    ],
)
def test_bad_values_are_refused_with_a_message(helm_bin: str, sets: list[str], message: str) -> None:
    assert message in render_error(helm_bin, VALUES_FILES["redis"], sets)


def test_manifests_validate_against_kubernetes_schemas(helm_bin: str, tmp_path: Path) -> None:
    paths = []
    for name, values in sorted(VALUES_FILES.items()):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump_all(render(helm_bin, values)))
        paths.append(str(path))
    for version in KUBERNETES_VERSIONS:
        done = subprocess.run(
            [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", version, *paths],
            capture_output=True, text=True, timeout=VALIDATE_TIMEOUT_S, check=False)
        assert done.returncode == 0, f"kubernetes-validate {version}:\n{done.stdout}{done.stderr}"
        lines = (done.stdout + done.stderr).splitlines()
        passed = [line for line in lines if line.startswith("INFO") and "passed" in line]
        assert len(passed) > 30, done.stdout
        # The one kind without a Kubernetes schema is the Prometheus Operator's CRD; it is
        # checked by test_template_wires_backend_specific_settings instead.
        others = [line for line in lines if not line.startswith("INFO")]
        assert all("kind ServiceMonitor" in line for line in others), "\n".join(others)


def checkov_skips() -> list[str]:
    """The chart's justified skips (helm/cornus/.checkov.yaml, a comment beside each)."""
    return list(yaml.safe_load((CHART / ".checkov.yaml").read_text())["skip-check"])


def run_checkov(checkov: str, args: list[str], env: dict[str, str] | None = None) -> None:
    # --skip-download: no network (checkov otherwise fetches policy metadata from its vendor).
    done = subprocess.run([checkov, *args, "--quiet", "--compact", "--skip-download", "-o", "json"],
                          capture_output=True, text=True, timeout=CHECKOV_TIMEOUT_S, check=False, env=env)
    try:
        reports = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"checkov {' '.join(args)} printed no JSON (exit {done.returncode}):\n{done.stderr[-3000:]}")
    reports = reports if isinstance(reports, list) else [reports]
    failed = [f"{check['check_id']} {check['resource']} ({check['file_path']})"
              for report in reports for check in report["results"]["failed_checks"]]
    assert not failed, "checkov failed checks:\n" + "\n".join(failed)
    assert sum(report["summary"]["passed"] for report in reports) > 0, done.stdout[:2000]


def test_checkov_rendered_manifests(helm_bin: str, checkov_bin: str, tmp_path: Path) -> None:
    for name, values in sorted(VALUES_FILES.items()):
        docs = render(helm_bin, values, [f"image.digest={DIGEST}", f"devRedis.image.digest={DIGEST}"])
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump_all(docs))
    # Rendered with digests, so "Image should use digest" (CKV_K8S_43) is checked, not skipped.
    skips = [check for check in checkov_skips() if check != "CKV_K8S_43"]
    run_checkov(checkov_bin, ["-d", str(tmp_path), "--framework", "kubernetes", "--skip-check", ",".join(skips)])


def test_checkov_chart(helm_bin: str, checkov_bin: str) -> None:
    # checkov's helm framework renders the chart with its default values, itself, under the
    # namespace "default": CKV_K8S_21 ("the default namespace should not be used") is about where
    # `helm install --namespace` puts the release, not about the chart, whose every resource
    # takes the release's namespace (the rendered-manifest run above checks it, in namespace cornus).
    skips = [*checkov_skips(), "CKV_K8S_21"]
    env = {**os.environ, "PATH": f"{Path(helm_bin).parent}{os.pathsep}{os.environ['PATH']}"}
    run_checkov(checkov_bin, ["-d", str(CHART), "--framework", "helm", "--skip-check", ",".join(skips)], env)


def test_large_limits_from_a_values_file_reach_the_node_as_integers(helm_bin: str, tmp_path: Path) -> None:
    """Helm reads numbers of a values file as floats, and a float of a million prints as 1e+06,
    which the node refuses: a pod given `txn_count_max: 1000000` in a -f file crash-looped."""
    values = tmp_path / "big.yaml"
    values.write_text("timeouts:\n  txn_count_max: 1000000\n  timeout_ms_txn_idle: 3600000\n")
    docs = render(helm_bin, values)
    env = {item["name"]: item.get("value") for item in node_container(docs)["env"]}
    assert env["CORNUS_TXN_COUNT_MAX"] == "1000000" and env["CORNUS_TIMEOUT_MS_TXN_IDLE"] == "3600000", env
    config = load_node_config(environ=pod_environ(node_container(docs), "cornus-0"))
    assert config.limits.txn_count_max == 1_000_000 and config.limits.timeout_ms_txn_idle == 3_600_000


def _egress_allows(policy: dict[str, Any], cidr: str, port: int) -> bool:
    """Whether an egress rule of `policy` admits TCP to `cidr`:`port` (a rule without `to` admits
    any address; without `ports`, any port)."""
    for rule in policy["spec"]["egress"]:
        ports = [item["port"] for item in rule.get("ports", []) if item.get("protocol", "TCP") == "TCP"]
        blocks = [peer["ipBlock"]["cidr"] for peer in rule.get("to", []) if "ipBlock" in peer]
        if (not rule.get("ports") or port in ports) and (not rule.get("to") or cidr in blocks):
            return True
    return False


@pytest.mark.parametrize(("backend", "reaches"), [("dynamodb", True), ("redis", False), ("azure_blob", False)])
def test_network_policy_lets_dynamodb_nodes_reach_the_eks_pod_identity_agent(
    helm_bin: str, backend: str, reaches: bool
) -> None:
    """values.yaml offers EKS Pod Identity for DynamoDB credentials; the SDK fetches them from the
    node-local agent at 169.254.170.23:80 (fd00:ec2::23 on IPv6), which the NetworkPolicy blocked,
    so such pods could never sign a request. Other backends have no reason to reach it."""
    policy = find(render(helm_bin, VALUES_FILES[backend]), "NetworkPolicy", "cornus")
    for cidr in ("169.254.170.23/32", "fd00:ec2::23/128"):
        assert _egress_allows(policy, cidr, 80) is reaches, (
            f"{backend}: egress to the EKS Pod Identity agent {cidr}:80 {'blocked' if reaches else 'allowed'}: "
            f"{policy['spec']['egress']}"
        )


def _pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod spec a render creates (workloads' templates, hook jobs, bare pods), by kind/name."""
    specs = {}
    for doc in docs:
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] == "Pod":
            specs[name] = doc["spec"]
        elif doc["kind"] in ("StatefulSet", "Deployment", "Job"):
            specs[name] = doc["spec"]["template"]["spec"]
    return specs


def test_every_pod_of_the_release_is_placed_by_node_selector_and_tolerations(helm_bin: str) -> None:
    """nodeSelector and tolerations reached the node pods only: the rebalance hook, the helm test
    pod and the dev Redis could land where the nodes may not (an amd64 node for an arm64 image)
    or wait unschedulable on a cluster whose every node is tainted."""
    sets = ["nodeSelector.kubernetes\\.io/arch=arm64", "tolerations[0].key=dedicated",
            "tolerations[0].operator=Equal", "tolerations[0].value=cornus", "tolerations[0].effect=NoSchedule"]
    specs = _pod_specs(render(helm_bin, VALUES_FILES["dev_redis"], sets))
    assert {"StatefulSet/cornus", "Job/cornus-rebalance", "Pod/cornus-test-commit"} <= set(specs), sorted(specs)
    assert any("redis" in name and name != "StatefulSet/cornus" for name in specs), sorted(specs)
    toleration = {"key": "dedicated", "operator": "Equal", "value": "cornus", "effect": "NoSchedule"}
    misplaced = {
        name: (spec.get("nodeSelector"), spec.get("tolerations")) for name, spec in specs.items()
        if spec.get("nodeSelector") != {"kubernetes.io/arch": "arm64"} or spec.get("tolerations") != [toleration]
    }
    assert not misplaced, f"pods that ignore nodeSelector/tolerations: {misplaced}"
