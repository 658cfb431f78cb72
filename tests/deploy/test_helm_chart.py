"""The Helm chart, checked offline: `helm lint --strict` and `helm template` with each backend's
values file, the rendered manifests against the Kubernetes schemas of several minor versions
(`kubernetes-validate --strict`), checkov on the chart and on the rendered manifests, the refusals
of values.schema.json and of the templates (the same timeout combinations as the node's own
config loader), the NetworkPolicies' rules, the rebalance hook's deadline against helm's, and
the rendered configuration of every pod loaded by the node's own config loader, so a variable
the node does not know fails here rather than in a crash-looping pod.
(tests/deploy/test_chart_cluster.py starts the rendered pods as processes.)
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import kubernetes_validate.utils
import pytest
import yaml

from cornus.protocol.config import OUTCOME_KEEP_MS_FLOOR, ProtocolConfig
from cornus.protocol.ownership import OwnershipConfig
from cornus.protocol.sweeper import sweep_age_ms_min
from cornus.runtime.config import RuntimeLimits, load_node_config, timeout_maxima, timeout_names_all
from services.client import ClientConfig
from services.serve import SHUTDOWN_BUDGET_S, SHUTDOWN_BUDGET_S_BUT_COLLECT, STORAGE_OPEN_TIMEOUT_S
from storage_adapters.contract import OWNER_LEASE_MS_MAX, PARTICIPANT_COUNT_MAX, SCAN_PAGE_COUNT_MAX
from storage_adapters.errors import ValidationError
from storage_adapters.factory import TIMEOUT_MS_CALL_MAX, StoreConfig
from tests.deploy.conftest import (
    CHART,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    VALUES_FILES,
    find,
    parse_manifests,
    render,
    render_error,
    run_helm,
)

# The oldest minor version the chart supports, a recent one that AKS and EKS both offer, and the
# newest whose schemas kubernetes-validate ships (so an API the next Kubernetes drops shows here).
KUBERNETES_VERSIONS = tuple(dict.fromkeys(("1.29.0", "1.33.0", kubernetes_validate.utils.latest_version())))
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
    ("cornus-admin", "admin-token"): "a-random-admin-token-0123456789",
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


def test_the_admin_token_comes_from_a_secret_of_the_user_or_one_the_chart_makes(helm_bin: str) -> None:
    """Found by audit (2026-11-27): the admin endpoints (a forced resolve aborts another client's
    transaction) were open to every client of the API. The chart gives every node a token: the
    user's Secret's, or a random one in a Secret of the release (kept across upgrades by lookup)."""
    docs = render(helm_bin, VALUES_FILES["redis"])
    env = {item["name"]: item for item in node_container(docs)["env"]}
    assert env["CORNUS_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "cornus-admin", "key": "admin-token"}
    token = base64.b64decode(find(docs, "Secret", "cornus-admin")["data"]["admin-token"]).decode()
    assert len(token) == 40 and token.isalnum()
    assert token != base64.b64decode(find(render(helm_bin, VALUES_FILES["redis"]), "Secret", "cornus-admin")[
        "data"]["admin-token"]).decode(), "two installs got the same token"
    load_node_config(environ={**pod_environ(node_container(docs), "cornus-0"), "CORNUS_ADMIN_TOKEN": token})
    own = render(helm_bin, VALUES_FILES["redis"], ["adminToken.existingSecret=ops-tokens", "adminToken.key=cornus"])
    assert node_container(own)["env"][[e["name"] for e in node_container(own)["env"]].index("CORNUS_ADMIN_TOKEN")][
        "valueFrom"]["secretKeyRef"] == {"name": "ops-tokens", "key": "cornus"}
    assert not [doc for doc in own if doc["kind"] == "Secret" and doc["metadata"]["name"] == "cornus-admin"]


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
    # SIGTERM: the APIs, then the node's own stop, each within its budget (services/serve.py).
    assert pod_spec["terminationGracePeriodSeconds"] > SHUTDOWN_BUDGET_S
    # And the least the schema lets a user set (found: 25 s, below a budget that had grown to 27),
    # with no wait for the collections; the template checks that wait's part.
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["terminationGracePeriodSeconds"]["minimum"] > SHUTDOWN_BUDGET_S_BUT_COLLECT
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


def test_each_release_names_its_own_cluster_unless_told_which(helm_bin: str) -> None:
    """The cluster id goes into the storage's cluster record (cornus/runtime/cluster_record.py):
    two releases of one name in two namespaces have the same node ids, and their ids must differ
    so that the second one over the same storage refuses it rather than take the first one's
    identities. One set by hand (a release moved to another namespace) is passed as it is."""
    def cluster_id(namespace: str, sets: Sequence[str] = ()) -> str:
        docs = render(helm_bin, VALUES_FILES["redis"], sets, namespace=namespace)
        config = load_node_config(environ=pod_environ(node_container(docs), f"{RELEASE}-0"))
        return config.cluster_id

    assert cluster_id("team-a") == f"team-a.{RELEASE}"
    assert cluster_id("team-b") == f"team-b.{RELEASE}"
    assert cluster_id("team-b", ["clusterId=team-a.cornus"]) == "team-a.cornus"


def test_schema_timeouts_are_the_nodes() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    names = set(schema["properties"]["timeouts"]["propertyNames"]["enum"])
    # storage_deadline_ms is set through storage.timeoutMsCall, late_write_window_ms is the
    # backend's own (the node refuses both on their own).
    assert names == timeout_names_all() - {"storage_deadline_ms", "late_write_window_ms"}


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
        # Three ports on one address, two on one Service: each needs its own.
        (["ports.peer=8100"], "ports.peer (8100), ports.http (8100) and ports.grpc (9100) must be three different"),
        (["ports.grpc=7100"], "must be three different ports"),
        (["ports.http=9100"], "must be three different ports"),
        (["service.ports.grpc=8100"], "service.ports.http and service.ports.grpc are both 8100"),
        # A pattern's failure says in words what is expected, not only the regular expression.
        (["image.digest=latest"], "an image digest: sha256: followed by 64 lowercase hex digits"),
        (["listenHost=::"], "IPv6 is not supported"),
        # Found by audit (2026-11-27): characters the node's address pattern refuses rendered, and
        # every pod crash-looped on its own configuration.
        (["listenHost=my_host"], "listenHost"),
        (["clusterDomain=cluster_local"], "clusterDomain"),
        # Found by audit (2026-11-27): a startup probe shorter than a node's wait for its storage
        # at start (60 s) had Kubernetes kill every pod that waited for slow storage.
        (["probes.startup.failureThreshold=10"], "probes.startup"),
        # Found by audit (2026-11-28, second): the wait's last try may start just before 60 s and
        # take two storage calls more; with slow calls the default probe (90 s) killed such a pod.
        (["storage.timeoutMsCall=30000", "timeouts.gc_grace_ms=61000"], "must exceed 120 s"),
        # Found by review (2026-11-27): a stop waits for its collections too; a grace period that
        # ends first has Kubernetes kill the pod before it collected or closed its store.
        (["terminationGracePeriodSeconds=44"], "terminationGracePeriodSeconds (44) must exceed a node's bounded stop"),
        (["timeouts.timeout_ms_stop_collect=20000"], "timeout_ms_stop_collect (20000 ms)"),
        (["storage.redis.url=redis://:secret@redis:6379/0", "storage.redis.existingSecret="],
         "a redis:// or rediss:// URL without a user or password"),
        (["storage.backend=azure_blob", "storage.azureBlob.existingSecret=s", "storage.azureBlob.container=A_b"],
         "an Azure container name"),
        (["resources.requests.cpu=lots"], "a Kubernetes quantity"),
        (["clusterId=team a"], "a cluster id"),
        (["storage.redis.durability=sometimes"], "/storage/redis/durability"),
        (["storage.redis.durability=replicas:9"], "aof, none, or replicas:N with N from 1 to 5"),
        # Gone with the one lifecycle rule it named (each tombstone is tagged with its own days).
        (["storage.azureBlob.tombstoneKeepDays=1"], "tombstoneKeepDays"),
        ([f"clusterId={'c' * 129}"], "/clusterId"),
        (["serviceMonitor.interval=30 seconds"], "a Prometheus duration"),
        (["peerTls.enabled=true"], "peerTls.enabled=true needs peerTls.secretName"),
        (["adminToken.key=a key"], "/adminToken/key"),
        (["peerTls.verifyHostname=maybe"], "/peerTls/verifyHostname"),
        # The explanation is no value itself.
        (["image.digest=an image digest: sha256: followed by 64 lowercase hex digits\\, or empty for none"],
         "/image/digest"),
    ],
)
def test_bad_values_are_refused_with_a_message(helm_bin: str, sets: list[str], message: str) -> None:
    assert message in render_error(helm_bin, VALUES_FILES["redis"], sets)


# The node's defaults, which the chart's cornus.validate must assume for values left unset: the
# cases below sit on each side of every cross-field rule, computed from these, so a default that
# drifts from the node's moves a bound and fails a case.
_PROTOCOL, _LIMITS, _OWNERSHIP = ProtocolConfig(), RuntimeLimits(), OwnershipConfig()
_CALL_MS = StoreConfig().timeout_ms_call
_KEEP_MS = OUTCOME_KEEP_MS_FLOOR
_CALL_MS_FOR_DEFAULT_GRACE = (_PROTOCOL.gc_grace_ms - _PROTOCOL.clock_slack_ms) // 2
_SLACK_MS_FOR_DEFAULT_GRACE = _PROTOCOL.gc_grace_ms - 2 * _CALL_MS
_GRACE_MS_MIN = 2 * _CALL_MS + _PROTOCOL.clock_slack_ms
_SWEEP_AGE_MS_MIN = sweep_age_ms_min(dataclasses.replace(_PROTOCOL, storage_deadline_ms=_CALL_MS),
                                     _LIMITS.timeout_ms_peer_request)
# (values beyond ci/redis-values.yaml, the word helm's refusal names, the word the node's does).
TIMEOUT_CASES: dict[str, tuple[dict[str, Any], str, str]] = {
    # The combinations the audit found installing fine and crash-looping the pods.
    "call 100000": ({"storage": {"timeoutMsCall": 100_000}}, "gc_grace_ms", "gc_grace_ms"),
    "grace 1000": ({"timeouts": {"gc_grace_ms": 1_000}}, "gc_grace_ms", "gc_grace_ms"),
    "lease 1": ({"timeouts": {"lease_ms": 1}}, "lease_ms", "lease_ms"),
    "slack 999999": ({"timeouts": {"clock_slack_ms": 999_999}}, "gc_grace_ms", "gc_grace_ms"),
    # A grace beyond the stop's wait for collection (15 s) needs that wait off, or as long: the
    # chart refuses less (tests/deploy/test_chart_resend_and_stop_collect.py), the node only warns.
    "call 100000 with its grace": ({"storage": {"timeoutMsCall": 100_000},
                                    "timeouts": {"gc_grace_ms": 201_000, "timeout_ms_stop_collect": 0}}, "", ""),
    "azure example": ({"storage": {"timeoutMsCall": 8_000},
                       "timeouts": {"gc_grace_ms": 20_000, "timeout_ms_stop_collect": 0}}, "", ""),
    # Each side of each rule, the other values the node's defaults.
    "call at the default grace": ({"storage": {"timeoutMsCall": _CALL_MS_FOR_DEFAULT_GRACE}}, "", ""),
    "call past the default grace": ({"storage": {"timeoutMsCall": _CALL_MS_FOR_DEFAULT_GRACE + 1}},
                                    "gc_grace_ms", "gc_grace_ms"),
    "slack at the default grace": ({"timeouts": {"clock_slack_ms": _SLACK_MS_FOR_DEFAULT_GRACE}}, "", ""),
    "slack past the default grace": ({"timeouts": {"clock_slack_ms": _SLACK_MS_FOR_DEFAULT_GRACE + 1}},
                                     "gc_grace_ms", "gc_grace_ms"),
    "grace at its minimum": ({"timeouts": {"gc_grace_ms": _GRACE_MS_MIN}}, "", ""),
    "grace below its minimum": ({"timeouts": {"gc_grace_ms": _GRACE_MS_MIN - 1}}, "gc_grace_ms", "gc_grace_ms"),
    "lease twice the renewal": ({"timeouts": {"lease_ms": 2 * _OWNERSHIP.renew_interval_ms}}, "", ""),
    "lease under twice the renewal": ({"timeouts": {"lease_ms": 2 * _OWNERSHIP.renew_interval_ms - 1}},
                                      "lease_ms", "lease_ms"),
    "renewal half the lease": ({"timeouts": {"renew_interval_ms": _OWNERSHIP.lease_ms // 2}}, "", ""),
    "renewal over half the lease": ({"timeouts": {"renew_interval_ms": _OWNERSHIP.lease_ms // 2 + 1}},
                                    "renew_interval_ms", "renew_interval_ms"),
    "renewal and lease together": ({"timeouts": {"renew_interval_ms": 3_000, "lease_ms": 6_000}}, "", ""),
    "backoff min at max": ({"timeouts": {"backoff_ms_min": _PROTOCOL.backoff_ms_max}}, "", ""),
    "backoff min over max": ({"timeouts": {"backoff_ms_min": _PROTOCOL.backoff_ms_max + 1}},
                             "backoff_ms_min", "backoff_ms_min"),
    "backoff max under min": ({"timeouts": {"backoff_ms_max": _PROTOCOL.backoff_ms_min - 1}},
                              "backoff_ms_min", "backoff_ms_min"),
    "resend at the backoff ceiling": ({"timeouts": {"timeout_ms_resend": _PROTOCOL.backoff_ms_max}}, "", ""),
    "resend over the backoff ceiling": ({"timeouts": {"timeout_ms_resend": _PROTOCOL.backoff_ms_max + 1}},
                                        "timeout_ms_resend", "timeout_ms_resend"),
    "backoff ceiling under the resend": ({"timeouts": {"backoff_ms_max": _PROTOCOL.timeout_ms_resend - 1}},
                                         "timeout_ms_resend", "timeout_ms_resend"),
    "ops per request at per transaction": ({"timeouts": {"op_count_max": _LIMITS.txn_op_count_max}}, "", ""),
    "ops per request over per transaction": ({"timeouts": {"op_count_max": _LIMITS.txn_op_count_max + 1}},
                                             "op_count_max", "op_count_max"),
    "ops per transaction under per request": ({"timeouts": {"txn_op_count_max": _LIMITS.op_count_max - 1}},
                                              "op_count_max", "op_count_max"),
    # A one-shot's vote must land before its tombstone goes: the wait, three slacks and a deadline
    # at most the grace plus the keep (at its floor here).
    "a peer wait that fits the keep": ({"timeouts": {"outcome_keep_ms": _KEEP_MS, "timeout_ms_peer_request": (
        _PROTOCOL.gc_grace_ms + _KEEP_MS - 3 * _PROTOCOL.clock_slack_ms - _CALL_MS)}}, "", ""),
    "a peer wait past the keep": ({"timeouts": {"outcome_keep_ms": _KEEP_MS, "timeout_ms_peer_request": (
        _PROTOCOL.gc_grace_ms + _KEEP_MS + 1 - 3 * _PROTOCOL.clock_slack_ms - _CALL_MS)}},
        "timeout_ms_peer_request", "timeout_ms_peer_request"),
    "a keep at its floor": ({"timeouts": {"outcome_keep_ms": OUTCOME_KEEP_MS_FLOOR}}, "", ""),
    "a keep under its floor": ({"timeouts": {"outcome_keep_ms": OUTCOME_KEEP_MS_FLOOR - 1}},
                               "outcome_keep_ms", "outcome_keep_ms"),
    "lease at its limit": ({"timeouts": {"lease_ms": OWNER_LEASE_MS_MAX}}, "", ""),
    "lease over its limit": ({"timeouts": {"lease_ms": OWNER_LEASE_MS_MAX + 1}}, "lease_ms", "lease_ms"),
    "scan page at its limit": ({"timeouts": {"scan_page_count_max": SCAN_PAGE_COUNT_MAX}}, "", ""),
    "scan page over its limit": ({"timeouts": {"scan_page_count_max": SCAN_PAGE_COUNT_MAX + 1}},
                                 "scan_page_count_max", "scan_page_count_max"),
    "partitions at the vote's limit": ({"timeouts": {"txn_partition_count_max": PARTICIPANT_COUNT_MAX}}, "", ""),
    "partitions over the vote's limit": ({"timeouts": {"txn_partition_count_max": PARTICIPANT_COUNT_MAX + 1}},
                                         "txn_partition_count_max", "txn_partition_count_max"),
    "call at its limit": ({"storage": {"timeoutMsCall": TIMEOUT_MS_CALL_MAX},
                           "timeouts": {"gc_grace_ms": 3 * TIMEOUT_MS_CALL_MAX, "timeout_ms_stop_collect": 0}},
                          "", ""),
    "call over its limit": ({"storage": {"timeoutMsCall": TIMEOUT_MS_CALL_MAX + 1},
                             "timeouts": {"gc_grace_ms": 3 * TIMEOUT_MS_CALL_MAX, "timeout_ms_stop_collect": 0}},
                            "timeoutMsCall", "timeout_ms_call"),
    "a zero timeout": ({"timeouts": {"timeout_ms_prepare": 0}}, "timeout_ms_prepare", "timeout_ms_prepare"),
    # No lifecycle rule but Azure's bounds the keep: a week on Redis.
    "a week's outcome keep": ({"timeouts": {"outcome_keep_ms": 7 * 86_400_000}}, "", ""),
    # A sweeper's age at its least and under it (sweeper.sweep_age_ms_min); unchecked while off.
    "a sweep age at its least": ({"timeouts": {"sweep_interval_ms": 60_000, "sweep_age_ms": _SWEEP_AGE_MS_MIN}},
                                 "", ""),
    "a sweep age under its least": ({"timeouts": {"sweep_interval_ms": 60_000,
                                                  "sweep_age_ms": _SWEEP_AGE_MS_MIN - 1}},
                                    "sweep_age_ms", "sweep_age_ms"),
    "a sweep age under its least, sweeping by default": ({"timeouts": {"sweep_age_ms": _SWEEP_AGE_MS_MIN - 1}},
                                                        "sweep_age_ms", "sweep_age_ms"),
    "a sweep age under its least, not sweeping": ({"timeouts": {"sweep_interval_ms": 0,
                                                                "sweep_age_ms": _SWEEP_AGE_MS_MIN - 1}}, "", ""),
    # The node's budget of sweeper calls (sweeper.SweepBudget): a positive integer, reaching the
    # node as set.
    "a sweep budget of one call a second": ({"timeouts": {"sweep_calls_per_s_max": 1}}, "", ""),
    "a sweep budget of none": ({"timeouts": {"sweep_calls_per_s_max": 0}}, "sweep_calls_per_s_max",
                               "sweep_calls_per_s_max must be a positive integer"),
}


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = _merged(merged.get(key, {}), value) if isinstance(value, dict) else value
    return merged


def _flattened(values: dict[str, Any], prefix: str = "") -> list[str]:
    """`--set` arguments for nested values."""
    items: list[str] = []
    for key, value in values.items():
        items += _flattened(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}={value}"]
    return items


def _node_verdict(environ: dict[str, str]) -> str:
    """"" if the node accepts this configuration, else its message."""
    try:
        load_node_config(environ=environ)
    except ValidationError as error:
        return str(error)
    return ""


@pytest.fixture(scope="module")
def redis_pod_environ(helm_bin: str) -> dict[str, str]:
    """The environment of cornus-0 in the Redis example's render."""
    return pod_environ(node_container(render(helm_bin, VALUES_FILES["redis"])), "cornus-0")


# Every case from a values file (numbers are floats to helm); the audit's, as reported, by --set
# (int64) too.
_AUDIT_CASES = ("call 100000", "grace 1000", "lease 1", "slack 999999", "call 100000 with its grace")


def _template_args(values_file: Path, extra: dict[str, Any], how: str, tmp_path: Path) -> list[str]:
    """`helm template` of the chart with an example's values and `extra` on top of them, given in
    a values file (numbers reach helm as floats) or by --set (as strings)."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION]
    if how == "values file":
        values = tmp_path / "values.yaml"
        values.write_text(yaml.safe_dump(_merged(yaml.safe_load(values_file.read_text()), extra)))
        return [*args, "-f", str(values)]
    args += ["-f", str(values_file)]
    for item in _flattened(extra):
        args += ["--set", item]
    return args


# Failures of the default 2 s startup probe past the longest wait for storage at start the chart
# allows (60 s, then two calls of the schema's longest timeoutMsCall, 600 s).
STARTUP_FAILURES_FOR_ANY_CALL = 700


@pytest.mark.parametrize(("case", "how"), [*((case, "values file") for case in sorted(TIMEOUT_CASES)),
                                           *((case, "--set") for case in _AUDIT_CASES)])
def test_helm_refuses_exactly_the_timeouts_the_node_refuses(helm_bin: str, redis_pod_environ: dict[str, str],
                                                            tmp_path: Path, case: str, how: str) -> None:
    """The chart passes storage.timeoutMsCall and timeouts.* to the node as CORNUS_* variables, and
    the node checks them together at start. A combination it refuses must fail the install, and
    one it accepts must install, whether the values come from a file (floats to helm) or --set."""
    extra, helm_word, node_word = TIMEOUT_CASES[case]
    # A startup probe long enough for any storage deadline here: its own rule (the wait for
    # storage at start) is the chart's alone, tested above.
    probes = {"probes": {"startup": {"failureThreshold": STARTUP_FAILURES_FOR_ANY_CALL}}}
    done = run_helm(helm_bin, _template_args(VALUES_FILES["redis"], {**extra, **probes}, how, tmp_path))
    # What the node makes of the variables the chart passes: the Redis example's pod environment
    # with this case's values, as the StatefulSet template spells them.
    environ = dict(redis_pod_environ)
    if "timeoutMsCall" in extra.get("storage", {}):
        environ["CORNUS_STORAGE_TIMEOUT_MS_CALL"] = str(extra["storage"]["timeoutMsCall"])
    for name, value in extra.get("timeouts", {}).items():
        environ[f"CORNUS_{name.upper()}"] = str(value)
    node_refusal = _node_verdict(environ)
    if done.returncode == 0:
        # Installed: the pods get exactly what the render says, and the node must take it.
        rendered = pod_environ(node_container(parse_manifests(done.stdout)), "cornus-0")
        assert not node_refusal and not _node_verdict(rendered), (
            f"helm installs {extra}, the node refuses it: {node_refusal or _node_verdict(rendered)}")
        assert not helm_word, f"{case}: expected a refusal naming {helm_word}"
    else:
        assert node_refusal, f"helm refuses {extra}, which the node accepts:\n{done.stderr}"
        assert helm_word in done.stderr and node_word in node_refusal, (done.stderr, node_refusal)


def test_the_chart_bounds_each_timeout_where_the_node_does(
    helm_bin: str, redis_pod_environ: dict[str, str], tmp_path: Path,
) -> None:
    """The schema bounded four of the timeouts and limits; the node bounds every one, so a value
    over the node's maximum installed, and every pod restarted in a loop refusing it (found by
    review: timeout_ms_peer_request 300001, identity_check_ms 3600001, ...). Each one past its
    maximum is refused by both now."""
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["timeouts"]
    maxima = timeout_maxima()
    assert set(schema["propertyNames"]["enum"]) == set(maxima)
    for name, maximum in sorted(maxima.items()):
        assert schema["properties"][name]["maximum"] == maximum, name
        over = {"timeouts": {name: maximum + 1}}
        done = run_helm(helm_bin, _template_args(VALUES_FILES["redis"], over, "--set", tmp_path))
        assert done.returncode != 0 and name in done.stderr, (name, done.stderr)
        assert _node_verdict({**redis_pod_environ, f"CORNUS_{name.upper()}": str(maximum + 1)}), (
            f"the node takes {name}={maximum + 1}")


# Each values file as it is, and the Redis one with peer TLS (its Secret volume and mount).
_RENDERS = [(name, values, []) for name, values in sorted(VALUES_FILES.items())] + [
    ("redis_peer_tls", VALUES_FILES["redis"], ["peerTls.enabled=true", "peerTls.secretName=cornus-peer-tls"])]


def test_manifests_validate_against_kubernetes_schemas(helm_bin: str, tmp_path: Path) -> None:
    paths = []
    for name, values, sets in _RENDERS:
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump_all(render(helm_bin, values, sets)))
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
    for name, values, sets in _RENDERS:
        docs = render(helm_bin, values, [*sets, f"image.digest={DIGEST}", f"devRedis.image.digest={DIGEST}"])
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump_all(docs))
    # Rendered with digests, so "Image should use digest" (CKV_K8S_43) is checked, not skipped; and
    # in namespace cornus, so "the default namespace should not be used" (CKV_K8S_21) is too.
    skips = [check for check in checkov_skips() if check not in ("CKV_K8S_43", "CKV_K8S_21")]
    run_checkov(checkov_bin, ["-d", str(tmp_path), "--framework", "kubernetes", "--skip-check", ",".join(skips)])


def test_checkov_chart(helm_bin: str, checkov_bin: str) -> None:
    skips = checkov_skips()
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


# The address storage is reached at, and the ports the nodes' egress must then admit (those of
# the URL the chart was given; without one in it, the scheme's).
STORAGE_PORTS = [
    (["storage.redis.url=rediss://redis.example:10000/0"], 10000),
    (["storage.redis.url=redis://redis.example/0"], 6379),
    (["storage.backend=dynamodb", "storage.dynamodb.endpoint=http://dynamodb-local.dev:8000"], 8000),
    (["storage.backend=dynamodb", "storage.dynamodb.endpoint=http://dynamodb-local.dev"], 80),
    (["storage.backend=dynamodb"], 443),
    (["storage.redis.url=redis://redis.example:7000/0", "networkPolicy.storagePorts={7001}"], 7001),
]


@pytest.mark.parametrize(("sets", "port"), STORAGE_PORTS)
def test_network_policy_lets_nodes_reach_storage_on_the_port_of_its_url(
    helm_bin: str, sets: list[str], port: int
) -> None:
    """The egress rule admitted only the backend's usual ports (6379 and 6380, 443): with a URL on
    another (Azure Managed Redis listens on 10000, DynamoDB Local on 8000), a cluster that enforces
    the policy cut every node off storage, and they restarted in a loop (found by review)."""
    policy = find(render(helm_bin, sets=["devRedis.enabled=false", *sets]), "NetworkPolicy", "cornus")
    assert _egress_allows(policy, "203.0.113.7/32", port), policy["spec"]["egress"]
    assert not _egress_allows(policy, "203.0.113.7/32", 6380 if port != 6380 else 6379), policy["spec"]["egress"]


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


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels only, as the chart writes them) selects `labels`."""
    assert set(selector) <= {"matchLabels"}, selector
    return all(labels.get(key) == value for key, value in selector.get("matchLabels", {}).items())


def _rule_ports(rule: dict[str, Any]) -> set[Any]:
    return {item["port"] for item in rule["ports"]}


@pytest.mark.parametrize("values", ["redis", "dev_redis"])
def test_network_policies_admit_peers_only_from_peers_and_clients_only_from_allowed_clients(
    helm_bin: str, values: str
) -> None:
    docs = render(helm_bin, VALUES_FILES[values])
    client_from = (yaml.safe_load(VALUES_FILES[values].read_text()).get("networkPolicy") or {}).get("clientFrom", [])
    template = find(docs, "StatefulSet", "cornus")["spec"]["template"]
    node_labels = template["metadata"]["labels"]
    named_ports = {p["name"]: p["containerPort"] for p in node_container(docs)["ports"]}
    assert set(named_ports) == {"peer", "http", "grpc"}
    policy = find(docs, "NetworkPolicy", "cornus")["spec"]
    assert _selects(policy["podSelector"], node_labels) and set(policy["policyTypes"]) == {"Ingress", "Egress"}
    rules = policy["ingress"]
    # A rule without ports admits every port, one without `from` every source.
    assert all(rule.get("ports") for rule in rules), rules
    peer_rules = [rule for rule in rules if _rule_ports(rule) & {"peer", named_ports["peer"]}]
    assert len(peer_rules) == 1 and _rule_ports(peer_rules[0]) == {"peer"}, rules
    # Peers only: pods of this release's nodes, in this namespace (no namespaceSelector).
    assert peer_rules[0].get("from"), f"the peer port admits any source: {peer_rules[0]}"
    (peer_source,) = peer_rules[0]["from"]
    assert set(peer_source) == {"podSelector"} and _selects(peer_source["podSelector"], node_labels), peer_source
    # Selected by the node labels alone: nothing but the node pods carries all of them.
    other_pods = {name: spec for name, spec in _pod_specs(docs).items() if name != "StatefulSet/cornus"}
    labels_of = {doc["kind"] + "/" + doc["metadata"]["name"]: (doc["spec"]["template"]["metadata"]["labels"]
                                                               if doc["kind"] != "Pod" else doc["metadata"]["labels"])
                 for doc in docs if doc["kind"] in ("StatefulSet", "Job", "Pod")}
    assert not [name for name in other_pods if _selects(peer_source["podSelector"], labels_of[name])]
    client_rules = [rule for rule in rules if _rule_ports(rule) & {"http", "grpc", named_ports["http"],
                                                                   named_ports["grpc"]}]
    assert len(client_rules) == 1 and _rule_ports(client_rules[0]) == {"http", "grpc"}, rules
    assert len(rules) == 2, rules
    chart_clients = {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": RELEASE,
                                                     "cornus.dev/client": "true"}}}
    if client_from:
        # Exactly the allowed clients, and the chart's own (the helm test pod, the rebalance hook).
        assert client_rules[0]["from"] == [*client_from, chart_clients]
        for name in ("Pod/cornus-test-commit", "Job/cornus-rebalance"):
            assert _selects(chart_clients["podSelector"], labels_of[name]), name
        # With the ServiceMonitor on, Prometheus must be among them: /metrics is on the http port.
        assert find(docs, "ServiceMonitor", "cornus")
        assert any(entry.get("namespaceSelector") for entry in client_from), client_from
    else:
        assert "from" not in client_rules[0], "clientFrom is empty: the client ports admit anyone"
    # The chart's client pods accept nothing and reach only DNS and the nodes' client ports.
    clients = find(docs, "NetworkPolicy", "cornus-clients")["spec"]
    assert clients["ingress"] == [] and set(clients["policyTypes"]) == {"Ingress", "Egress"}
    dns, nodes = clients["egress"]
    assert "to" not in dns and {p["port"] for p in dns["ports"]} == {53}
    (node_target,) = nodes["to"]
    assert _selects(node_target["podSelector"], node_labels)
    assert _rule_ports(nodes) == {named_ports["http"], named_ports["grpc"]}


# helm's --timeout when none is given (5m0s): each hook Job is waited for at most this long.
HELM_TIMEOUT_S_DEFAULT = 300


def test_rebalance_hook_ends_within_helms_default_timeout_and_fails_on_its_verdict(helm_bin: str) -> None:
    """The Job's activeDeadlineSeconds (540 s) exceeded helm's default --timeout, so helm gave up
    with a generic timeout while the hook was still running; and it retried a verdict (exit 1)
    ten times. The Job must end within helm's wait, leave the hook its whole wait plus one round
    of requests, and fail at once on exit 1 (not placed) or 2 (bad input)."""
    docs = render(helm_bin, VALUES_FILES["redis"])
    job = find(docs, "Job", "cornus-rebalance")
    assert set(job["metadata"]["annotations"]["helm.sh/hook"].split(",")) == {"post-install", "post-upgrade"}
    spec = job["spec"]
    (container,) = spec["template"]["spec"]["containers"]
    args = container["args"]
    wait_s = float(args[args.index("--timeout-s") + 1])
    last_round_s = ClientConfig().timeout_ms_request / 1000
    assert wait_s + last_round_s <= spec["activeDeadlineSeconds"] < HELM_TIMEOUT_S_DEFAULT, spec
    rules = spec["podFailurePolicy"]["rules"]
    (fail,) = [rule for rule in rules if rule["action"] == "FailJob"]
    assert fail["onExitCodes"] == {"containerName": container["name"], "operator": "In", "values": [1, 2]}
    (ignore,) = [rule for rule in rules if rule["action"] == "Ignore"]
    assert ignore["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]
    # The membership it checks is the one the nodes run with.
    peers = {e["name"]: e.get("value") for e in node_container(docs)["env"]}["CORNUS_PEERS"]
    assert args[args.index("--expect-peers") + 1] == peers
    member_urls = args[args.index("--member-urls") + 1]
    assert [item.split("=")[0] for item in member_urls.split(",")] == [item.split("=")[0] for item in peers.split(",")]


_DAY_MS = 86_400_000
# Azure settings on each side of the rules the node applies to them (values beyond
# ci/azure-blob-values.yaml, the word helm's refusal names, the word the node's does). A tombstone's
# keep has no lifecycle rule of the install to fit: each is tagged with its own days, and the
# Terraform module has a rule for each (tests/storage/test_azure_lifecycle.py).
AZURE_KEEP_CASES: dict[str, tuple[dict[str, Any], str, str]] = {
    "the defaults": ({}, "", ""),
    "a week's keep": ({"timeouts": {"outcome_keep_ms": 7 * _DAY_MS}}, "", ""),
    # Azure's requests may land up to 15 minutes late: the tombstones must outlive that (the
    # deadline, 8 s in these values, plus the slack, 1 s, plus 15 minutes), set or, unset, the
    # node's default.
    "ten minutes' keep, shorter than a late request": ({"timeouts": {"outcome_keep_ms": 600_000}}, "late vote",
                                                       "late vote"),
    "a keep just past a late request": ({"timeouts": {"outcome_keep_ms": 909_000}}, "", ""),
    "a keep just short of a late request": ({"timeouts": {"outcome_keep_ms": 908_999}}, "late vote", "late vote"),
    # A one-shot's vote may land 15 minutes later still here: the peer wait counts it (gc_grace_ms
    # 300 s in these values, the keep at its least).
    "a peer wait whose late vote fits the keep": ({"timeouts": {"outcome_keep_ms": 909_000,
                                                               "timeout_ms_peer_request": 298_000}}, "", ""),
    "a peer wait whose late vote outlives the keep": ({"timeouts": {"outcome_keep_ms": 909_000,
                                                                   "timeout_ms_peer_request": 298_001}},
                                                      "timeout_ms_peer_request", "timeout_ms_peer_request"),
    # A fenced write on Azure lands before the lease its ownership blob grants ends, counted from
    # the blob's Last-Modified (whole seconds): the lease exceeds the renewal by 2 s at least.
    "a lease 2 s past the renewal": ({"timeouts": {"lease_ms": _OWNERSHIP.renew_interval_ms + 2_000}}, "", ""),
    "a lease under 2 s past the renewal": ({"timeouts": {"lease_ms": _OWNERSHIP.renew_interval_ms + 1_999}},
                                           "lease_ms", "lease_ms"),
    "a renewal too close to the lease": ({"timeouts": {"renew_interval_ms": 1_500, "lease_ms": 3_000}},
                                         "lease_ms", "lease_ms"),
}


@pytest.mark.parametrize(("case", "how"), [(case, how) for case in sorted(AZURE_KEEP_CASES)
                                           for how in ("values file", "--set")])
def test_helm_refuses_exactly_the_azure_settings_the_node_refuses(
        helm_bin: str, tmp_path: Path, case: str, how: str) -> None:
    """The chart mirrors the node's checks of Azure's keeps, late writes and leases, so that no
    install crash-loops its pods and none the node would run is refused."""
    extra, helm_word, node_word = AZURE_KEEP_CASES[case]
    done = run_helm(helm_bin, _template_args(VALUES_FILES["azure_blob"], extra, how, tmp_path))
    environ = pod_environ(node_container(render(helm_bin, VALUES_FILES["azure_blob"])), "cornus-0")
    for name, value in extra.get("timeouts", {}).items():
        environ[f"CORNUS_{name.upper()}"] = str(value)
    node_refusal = _node_verdict(environ)
    if done.returncode == 0:
        rendered = pod_environ(node_container(parse_manifests(done.stdout)), "cornus-0")
        assert not node_refusal and not _node_verdict(rendered), (
            f"helm installs {extra}, the node refuses it: {node_refusal or _node_verdict(rendered)}")
        assert not helm_word, f"{case}: expected a refusal naming {helm_word}"
    else:
        assert node_refusal, f"helm refuses {extra}, which the node accepts:\n{done.stderr}"
        assert helm_word in done.stderr and node_word in node_refusal, (done.stderr, node_refusal)


def test_the_redis_durability_value_reaches_the_node_which_accepts_it(helm_bin: str) -> None:
    """replicas:N (a managed Redis: its replicas are its durability) goes to the node as given."""
    docs = render(helm_bin, VALUES_FILES["redis"], ["storage.redis.durability=replicas:2"])
    environ = pod_environ(node_container(docs), "cornus-0")
    assert environ["CORNUS_STORAGE_REDIS_DURABILITY"] == "replicas:2"
    assert StoreConfig.from_env(environ).redis_durability == "replicas:2"
