"""The Terraform of terraform/, checked offline (no provider can be downloaded here, so no
`terraform validate`): every .tf parses (python-hcl2), every module variable has a description and
a type and every output a description, each example root passes every variable its module
requires, checkov passes (each skip justified in a `#checkov:skip` comment on its resource), and
what the modules create matches what the storage adapters do: the DynamoDB key schema, TTL on the
attribute the adapter's tombstones expire by, an IAM policy with exactly the adapter's calls, a
lifecycle rule on the record blobs only.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import hcl2
import pytest
import yaml

from cornus.runtime.config import load_node_config
from storage_adapters import azure_blob
from storage_adapters.azure_blob import DAY_MS
from storage_adapters.contract import TOMBSTONE_KEEP_MS_MAX, LogId
from tests.deploy.conftest import CHART, REPO, TERRAFORM, VALUES_FILES, find, render
from tests.deploy.test_helm_chart import DIGEST, node_container, pod_environ

CHECKOV_TIMEOUT_S = 300.0
MODULES = TERRAFORM / "modules"
EXAMPLES = TERRAFORM / "examples"
DYNAMODB_ADAPTER = REPO / "storage_adapters" / "dynamodb.py"
# What IAM authorizes each DynamoDB client call (and each TransactWriteItems/TransactGetItems item)
# of storage_adapters/dynamodb.py as.
IAM_ACTION_OF_CALL = {
    "describe_table": "dynamodb:DescribeTable",
    "describe_time_to_live": "dynamodb:DescribeTimeToLive",
    "describe_global_table": "dynamodb:DescribeGlobalTable",
    "get_item": "dynamodb:GetItem",
    "put_item": "dynamodb:PutItem",
    "update_item": "dynamodb:UpdateItem",
    "delete_item": "dynamodb:DeleteItem",
    "query": "dynamodb:Query",
    "batch_get_item": "dynamodb:BatchGetItem",
    "transact_get_items": "dynamodb:GetItem",
    # Authorized per item (IAM_ACTION_OF_TRANSACT_ITEM); there is no IAM action of its own.
    "transact_write_items": "",
}
IAM_ACTION_OF_TRANSACT_ITEM = {
    "Put": "dynamodb:PutItem",
    "Update": "dynamodb:UpdateItem",
    "Delete": "dynamodb:DeleteItem",
    "ConditionCheck": "dynamodb:ConditionCheckItem",
    "Get": "dynamodb:GetItem",
}
# Calls the node never makes on a table Terraform created: create_table runs only when the table
# is missing, and update_time_to_live only where the table's TTL is off (Terraform's is on; the
# node reads it at open, DescribeTimeToLive, and only warns if it cannot set it); delete_table is a
# test helper.
CALLS_NOT_GRANTED = {"create_table", "update_time_to_live", "delete_table"}
# Each module's backend, by the chart's example values file of that backend.
BACKEND_OF_MODULE = {"azure": "azure_blob", "aws": "dynamodb"}
# What Terraform fills in for the references in an example's chart values once it has applied:
# the names and ARNs of what it creates, and the variables a user must give.
APPLIED_VALUES = {
    "var.image_repository": "registry.example.com/cornus",
    "var.image_digest": DIGEST,
    "var.region": "eu-west-1",
    "azurerm_storage_container.cornus.name": "cornus",
    "aws_dynamodb_table.cornus.name": "cornus",
    "aws_iam_role.cornus.arn": "arn:aws:iam::123456789012:role/cornus",
}
_REFERENCE = re.compile(r"^\$\{(?P<ref>[^{}]+)\}$")


def unquote(value: Any) -> Any:
    """python-hcl2 keeps the quotes of string literals (and of block labels)."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


@functools.cache
def _parsed(path: Path) -> dict[str, Any]:
    with path.open() as handle:
        return hcl2.load(handle)


def load(path: Path) -> dict[str, Any]:
    """A .tf file, parsed once per process (python-hcl2 takes a good fraction of a second a file,
    and the Azure lifecycle test read the module's some forty times: 16 s of CPU); a copy, so no
    test changes what another reads."""
    return copy.deepcopy(_parsed(path))


def blocks(directory: Path, kind: str) -> dict[str, dict[str, Any]]:
    """Every `kind` block (variable, output, module) of a directory, by name."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.glob("*.tf")):
        for block in load(path).get(kind, []):
            for name, body in block.items():
                found[unquote(name)] = body
    return found


def resources(directory: Path, kind: str) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.glob("*.tf")):
        for block in [*load(path).get("resource", []), *load(path).get("data", [])]:
            for resource_type, named in block.items():
                if unquote(resource_type) == kind:
                    found.update({unquote(name): body for name, body in named.items()})
    return found


def test_every_tf_file_parses() -> None:
    paths = sorted(TERRAFORM.rglob("*.tf"))
    assert len(paths) >= 16, paths
    for path in paths:
        assert load(path), f"{path} parsed to nothing"


@pytest.mark.parametrize("directory", sorted(p.name for p in MODULES.iterdir()))
def test_module_interface_is_described(directory: str) -> None:
    for where in (MODULES / directory, EXAMPLES / directory):
        variables = blocks(where, "variable")
        assert variables, where
        for name, body in variables.items():
            assert unquote(body.get("description", "")).strip(), f"{where}: variable {name} has no description"
            assert "type" in body, f"{where}: variable {name} has no type"
        for name, body in blocks(where, "output").items():
            assert unquote(body.get("description", "")).strip(), f"{where}: output {name} has no description"


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.iterdir()))
def test_example_root_passes_every_required_variable(example: str) -> None:
    root = EXAMPLES / example
    modules = blocks(root, "module")
    assert modules, f"{root} calls no module"
    for name, call in modules.items():
        source = (root / unquote(call["source"])).resolve()
        required = {v for v, body in blocks(source, "variable").items() if "default" not in body}
        meta = {"source", "version", "providers", "count", "for_each", "depends_on"}
        passed = {key for key in call if not key.startswith("__")} - meta
        assert required <= passed, f"{root}: module {name} lacks {sorted(required - passed)}"
        assert passed <= set(blocks(source, "variable")), f"{root}: module {name} gets unknown {passed}"
    release = resources(root, "helm_release")["cornus"]
    chart = (root / unquote(release["chart"]).replace("${path.module}/", "")).resolve()
    assert chart == REPO / "helm" / "cornus"


def test_dynamodb_table_matches_the_adapter() -> None:
    source = DYNAMODB_ADAPTER.read_text()
    schema = dict(re.findall(r'\{"AttributeName": "(\w+)", "KeyType": "(HASH|RANGE)"\}', source))
    types = dict(re.findall(r'\{"AttributeName": "(\w+)", "AttributeType": "(\w)"\}', source))
    table = resources(MODULES / "aws", "aws_dynamodb_table")["cornus"]
    key_names = {"HASH": unquote(table["hash_key"]), "RANGE": unquote(table["range_key"])}
    assert {name: kind for kind, name in key_names.items()} == schema
    assert {unquote(a["name"]): unquote(a["type"]) for a in table["attribute"]} == types
    assert unquote(table["billing_mode"]) == "PAY_PER_REQUEST"
    assert table["point_in_time_recovery"][0]["enabled"] is True
    assert table["server_side_encryption"][0]["enabled"] is True
    # DynamoDB drops the adapter's tombstones by the table's TTL, on the attribute the adapter
    # names (and enables it on, in a table it creates itself): with none, they would stay forever.
    (expiry,) = re.findall(r'^_EXPIRES_AT = "(\w+)"$', source, re.MULTILINE)
    (ttl,) = table["ttl"]
    assert (unquote(ttl["attribute_name"]), ttl["enabled"]) == (expiry, True)
    assert '{"Enabled": True, "AttributeName": _EXPIRES_AT}' in source


def test_iam_policy_grants_exactly_the_adapters_calls() -> None:
    source = DYNAMODB_ADAPTER.read_text()
    calls = set(re.findall(r"self\._client\.(\w+)", source)) - CALLS_NOT_GRANTED
    unmapped = calls - set(IAM_ACTION_OF_CALL)
    assert not unmapped, f"DynamoDB calls this test does not map to IAM actions: {unmapped}"
    items = set(re.findall(r'"(Put|Update|Delete|ConditionCheck|Get)": \{', source))
    expected = {IAM_ACTION_OF_CALL[call] for call in calls} - {""}
    expected |= {IAM_ACTION_OF_TRANSACT_ITEM[item] for item in items}
    document = resources(MODULES / "aws", "aws_iam_policy_document")["dynamodb"]
    table, legacy = document["statement"]
    granted = {unquote(action) for statement in (table, legacy) for action in statement["actions"]}
    assert granted == expected
    assert [unquote(r) for r in table["resources"]] == ["${aws_dynamodb_table.cornus.arn}"]
    # A legacy global table of the table's name, the one DescribeGlobalTable is granted on.
    assert [unquote(a) for a in legacy["actions"]] == ["dynamodb:DescribeGlobalTable"]
    (resource,) = [unquote(r) for r in legacy["resources"]]
    assert resource.endswith(":global-table/${aws_dynamodb_table.cornus.name}"), resource


def test_azure_lifecycle_rule_deletes_only_transaction_records() -> None:
    # The adapter's record blobs: txn/<log>/<txn>; data/ and own/ must never expire.
    record_prefix = azure_blob._record_prefix(LogId.partition("p0")).split("/", 1)[0] + "/"
    assert record_prefix == "txn/"
    main = (MODULES / "azure" / "main.tf").read_text()
    assert 'record_prefix = "${var.container_name}/' + record_prefix + '"' in main
    rule = _lifecycle_rules()["delete-old-transaction-records"]
    assert rule["filters"][0]["prefix_match"] == ["${local.record_prefix}"]
    assert rule["actions"][0]["base_blob"][0]["delete_after_days_since_modification_greater_than"] == (
        "${var.record_retention_days}")
    account = resources(MODULES / "azure", "azurerm_storage_account")["cornus"]
    assert unquote(account["account_kind"]) == "StorageV2"
    assert unquote(account["min_tls_version"]) == "TLS1_2"
    assert account["allow_nested_items_to_be_public"] is False
    container = resources(MODULES / "azure", "azurerm_storage_container")["cornus"]
    assert unquote(container["container_access_type"]) == "private"
    cache = resources(MODULES / "azure", "azurerm_redis_cache")["cornus"]
    assert unquote(cache["sku_name"]) == "Premium"
    assert cache["redis_configuration"][0]["aof_backup_enabled"] is True
    # The node refuses a Redis that may evict (storage_adapters/redis_server_check.py _refuse_eviction).
    assert unquote(cache["redis_configuration"][0]["maxmemory_policy"]) == "noeviction"


def test_the_elasticache_redis_never_evicts() -> None:
    """ElastiCache defaults to volatile-lru, which evicts decision tombstones first; the node
    refuses such a Redis, so the module's replication group must use a noeviction parameter group."""
    (group,) = resources(MODULES / "aws", "aws_elasticache_parameter_group").values()
    parameters = [(unquote(p["name"]), unquote(p["value"])) for p in group["parameter"]]
    assert parameters == [("maxmemory-policy", "noeviction")]
    replication = resources(MODULES / "aws", "aws_elasticache_replication_group")["cornus"]
    assert unquote(replication["parameter_group_name"]) == "${aws_elasticache_parameter_group.cornus[0].name}"


@pytest.mark.parametrize(("module", "cache", "replicas"), [
    ("aws", "aws_elasticache_replication_group",
     "${aws_elasticache_replication_group.cornus[0].num_cache_clusters - 1}"),
    ("azure", "azurerm_redis_cache", "1"),
])
def test_the_managed_redis_is_named_with_the_durability_its_replicas_give(module: str, cache: str,
                                                                          replicas: str) -> None:
    """Neither managed Redis fsyncs each write, so the node must wait for its replicas (found by
    review: the docs sent users to durability none, which a failover turns into a lost vote). The
    module says how many there are, for storage.redis.durability."""
    value = unquote(_output_value(MODULES / module, "redis_durability"))
    assert f"\"replicas:{replicas}\"" in value, value
    resource = resources(MODULES / module, cache)["cornus"]
    if module == "aws":
        assert resource["num_cache_clusters"] == 2, "one primary and one replica: replicas:1"
    else:
        assert unquote(resource["sku_name"]) == "Premium" and "replicas_per_master" not in resource, (
            "a Premium cache has one replica unless replicas_per_master says otherwise")


def _lifecycle_rules() -> dict[str, dict[str, Any]]:
    """The Azure module's lifecycle management rules, by name (every rule of its one policy)."""
    (policy,) = resources(MODULES / "azure", "azurerm_storage_management_policy").values()
    rules = {unquote(rule["name"]): rule for rule in policy["rule"]}
    assert len(rules) == len(policy["rule"]), "two lifecycle rules share a name"
    return rules


def test_azure_lifecycle_rules_delete_decision_tombstones_and_never_a_record() -> None:
    """Azure Blob cannot expire a blob by itself, so lifecycle rules drop the decision tombstones
    that garbage collection leaves: they must select them by the blob index tags the adapter puts
    on each tombstone, and only on tombstones (tests/storage/test_azure_tombstones.py), because a
    rule without that filter would delete records that transactions still need. One rule per keep
    in whole days, up to a week's (tests/storage/test_azure_lifecycle.py checks each tombstone
    outlives its keep under them), and the backstop on the tag earlier versions set alone."""
    rules = _lifecycle_rules()
    assert set(rules) == {"delete-old-transaction-records", "delete-expired-decision-tombstones"}
    backstop = rules["delete-expired-decision-tombstones"]
    (filters,) = backstop["filters"]
    (tag,) = filters["match_blob_index_tag"]
    assert (unquote(tag["name"]), unquote(tag["operation"]), unquote(tag["value"])) == (
        azure_blob.TOMBSTONE_TAG, "==", azure_blob.TOMBSTONE_TAG_VALUE) == ("cornus-tombstone", "==", "1")
    (actions,) = backstop["actions"]
    (base_blob,) = actions["base_blob"]
    # Past the longest keep there is: a tombstone an earlier version wrote, whose keep is unknown.
    assert base_blob["delete_after_days_since_modification_greater_than"] * DAY_MS > TOMBSTONE_KEEP_MS_MAX
    (policy,) = resources(MODULES / "azure", "azurerm_storage_management_policy").values()
    (dynamic,) = policy["dynamic"]
    (by_days,) = dynamic.values()
    assert by_days["for_each"] == "${local.tombstone_keep_days_all}"
    keeps_days = blocks(MODULES / "azure", "locals")["tombstone_keep_days_all"]
    assert keeps_days == list(range(1, azure_blob.TOMBSTONE_DAYS_MAX + 1))
    (content,) = by_days["content"]
    assert content["enabled"] is True
    (filters,) = content["filters"]
    (tag,) = filters["match_blob_index_tag"]
    assert (unquote(tag["name"]), unquote(tag["operation"]), tag["value"]) == (
        azure_blob.TOMBSTONE_DAYS_TAG, "==", "${rule.value}")
    (actions,) = content["actions"]
    assert set(actions) - {"__is_block__"} == {"base_blob"}  # only the base blob, by days since its last write
    (base_blob,) = actions["base_blob"]
    assert {key: value for key, value in base_blob.items() if key != "__is_block__"} == {
        "delete_after_days_since_modification_greater_than": "${rule.value}"}
    # Every rule stays under the record prefix: data and ownership blobs never expire.
    for name, rule in [*rules.items(), ("by days", content)]:
        assert rule["filters"][0]["prefix_match"] == ["${local.record_prefix}"], name
        assert [unquote(kind) for kind in rule["filters"][0]["blob_types"]] == ["blockBlob"], name
    assert "tombstone_keep_days" not in blocks(MODULES / "azure", "variable")
    # Blob index tags exist only on accounts without a hierarchical namespace.
    account = resources(MODULES / "azure", "azurerm_storage_account")["cornus"]
    assert account.get("is_hns_enabled", False) is False


def test_azure_redis_persists_its_aof_through_the_storage_firewall() -> None:
    """The AOF account denies by default and admits Azure services by the trusted-service bypass,
    which admits a cache only when it writes with its managed identity: with the account key (SAS,
    the default) every AOF write is refused and the cache runs without persistence. So the cache
    has a system-assigned identity, writes with it, and holds Storage Blob Data Contributor on the
    AOF account."""
    cache = resources(MODULES / "azure", "azurerm_redis_cache")["cornus"]
    account = resources(MODULES / "azure", "azurerm_storage_account")["aof"]
    rules = account["network_rules"][0]
    assert unquote(rules["default_action"]) == "Deny" and [unquote(b) for b in rules["bypass"]] == ["AzureServices"]
    config = cache["redis_configuration"][0]
    assert unquote(config.get("data_persistence_authentication_method")) == "ManagedIdentity", config
    assert unquote(cache["identity"][0]["type"]) == "SystemAssigned"
    grants = [
        grant for grant in resources(MODULES / "azure", "azurerm_role_assignment").values()
        if unquote(grant["role_definition_name"]) == "Storage Blob Data Contributor"
        and unquote(grant["scope"]) == "${azurerm_storage_account.aof[0].id}"
    ]
    assert len(grants) == 1, "the cache's identity needs Storage Blob Data Contributor on the AOF account"
    assert unquote(grants[0]["principal_id"]) == "${azurerm_redis_cache.cornus[0].identity[0].principal_id}"


def test_azure_example_signs_in_to_the_cluster_with_entra_id() -> None:
    """The example's kubernetes and helm providers used the cluster's client certificate, which an
    AKS cluster with local accounts disabled (Entra ID only, as AKS recommends) does not issue,
    so `terraform apply` could not reach it. Both sign in through kubelogin now."""
    providers = {}
    for path in sorted((EXAMPLES / "azure").glob("*.tf")):
        for block in load(path).get("provider", []):
            providers.update({unquote(name): body for name, body in block.items()})
    kubernetes = {"kubernetes": providers["kubernetes"], "helm": providers["helm"]["kubernetes"][0]}
    for name, connection in kubernetes.items():
        assert "client_certificate" not in connection and "client_key" not in connection, name
        assert connection["exec"][0]["command"] == "${local.kube_exec.command}", name
    main = (EXAMPLES / "azure" / "main.tf").read_text()
    assert 'command     = "kubelogin"' in main and '"get-token", "--login", "azurecli"' in main


def test_aws_example_gets_a_fresh_cluster_token_for_every_call() -> None:
    """The example's helm provider used aws_eks_cluster_auth's token, read once when Terraform
    refreshes its data sources and valid 15 minutes: the release waits up to 15 minutes (timeout
    900) after a plan and a refresh, so a slow rollout failed Unauthorized halfway (found by
    review). The provider runs `aws eks get-token` whenever it needs one instead."""
    providers = {}
    for path in sorted((EXAMPLES / "aws").glob("*.tf")):
        for block in load(path).get("provider", []):
            providers.update({unquote(name): body for name, body in block.items()})
    connection = providers["helm"]["kubernetes"][0]
    assert "token" not in connection, "a token read at refresh expires during the apply"
    (exec_,) = connection["exec"]
    assert (unquote(exec_["command"]), unquote(exec_["api_version"])) == ("aws", "client.authentication.k8s.io/v1beta1")
    args = [unquote(arg) for arg in exec_["args"]]
    assert args[:2] == ["eks", "get-token"] and "${var.eks_cluster_name}" in args
    assert "aws_eks_cluster_auth" not in {unquote(kind) for path in sorted((EXAMPLES / "aws").glob("*.tf"))
                                          for block in load(path).get("data", []) for kind in block}


def test_checkov_terraform(checkov_bin: str) -> None:
    done = subprocess.run([checkov_bin, "-d", str(TERRAFORM), "--framework", "terraform", "--quiet", "--compact",
                           "--skip-download", "-o", "json"],
                          capture_output=True, text=True, timeout=CHECKOV_TIMEOUT_S, check=False)
    try:
        reports = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"checkov printed no JSON (exit {done.returncode}):\n{done.stderr[-3000:]}")
    reports = reports if isinstance(reports, list) else [reports]
    failed = [f"{check['check_id']} {check['resource']} ({check['file_path']})"
              for report in reports for check in report["results"]["failed_checks"]]
    assert not failed, "checkov failed checks:\n" + "\n".join(failed)
    assert sum(r["summary"]["passed"] for r in reports) > 0
    # Every skip is a `#checkov:skip=ID:reason` comment on its resource, and gives its reason.
    skips = [line.strip() for path in TERRAFORM.rglob("*.tf") for line in path.read_text().splitlines()
             if "checkov:skip" in line]
    assert sum(r["summary"]["skipped"] for r in reports) <= len(skips)
    for skip in skips:
        assert re.fullmatch(r"#checkov:skip=CKV2?_\w+:.{40,}", skip), f"a skip without its reason: {skip}"


def _output_value(module: Path, name: str) -> Any:
    (output,) = [body for output_name, body in blocks(module, "output").items() if output_name == name]
    return output["value"]


def _applied(value: Any, lookup: Any) -> Any:
    """`value` as parsed by python-hcl2 with every `${reference}` replaced by lookup(reference)
    and the quotes of string literals (and of keys) removed."""
    if isinstance(value, dict):
        return {unquote(key): _applied(item, lookup) for key, item in value.items() if not key.startswith("__")}
    if isinstance(value, list):
        return [_applied(item, lookup) for item in value]
    if isinstance(value, str) and (match := _REFERENCE.match(value)):
        return lookup(match["ref"])
    return unquote(value)


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """What helm makes of two values files given in this order."""
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = _merged(merged.get(key, {}), value) if isinstance(value, dict) else value
    return merged


def _example_chart_values(example: str) -> dict[str, Any]:
    """The values the example root's helm_release gives the chart: each `yamlencode(...)` of its
    values list, in order, references filled in as after an apply."""
    root = EXAMPLES / example
    (module_call,) = blocks(root, "module").values()
    module = (root / unquote(module_call["source"])).resolve()
    variables = blocks(root, "variable")
    local_values = {unquote(k): v for block in load(root / "main.tf").get("locals", []) for k, v in block.items()}

    def in_example(ref: str) -> Any:
        kind, _, name = ref.partition(".")
        if kind == "var" and "default" in variables.get(name, {}):
            return unquote(variables[name]["default"])
        if kind == "local" and name in local_values:
            return _applied(local_values[name], in_example)
        if ref == "module.storage.helm_values":
            return _applied(_output_value(module, "helm_values"), in_module)
        secret = re.fullmatch(r"kubernetes_secret\.(\w+)\.metadata\[0\]\.name", ref)
        if secret:
            return unquote(resources(root, "kubernetes_secret")[secret[1]]["metadata"][0]["name"])
        assert ref in APPLIED_VALUES, f"{root}: no value for ${{{ref}}}: add one to APPLIED_VALUES"
        return APPLIED_VALUES[ref]

    def in_module(ref: str) -> Any:
        kind, _, name = ref.partition(".")
        if kind == "var" and name in module_call:
            return _applied(module_call[name], in_example)
        if kind == "var" and "default" in blocks(module, "variable").get(name, {}):
            return unquote(blocks(module, "variable")[name]["default"])
        assert ref in APPLIED_VALUES, f"{module}: no value for ${{{ref}}}: add one to APPLIED_VALUES"
        return APPLIED_VALUES[ref]

    values: dict[str, Any] = {}
    for item in resources(root, "helm_release")["cornus"]["values"]:
        inner = re.fullmatch(r"\$\{yamlencode\((?P<expr>.*)\)\}", item, re.DOTALL)
        assert inner, f"{root}: helm_release value {item!r} is not a yamlencode(...)"
        values = _merged(values, _applied(hcl2.loads(f"x = {inner['expr']}")["x"], in_example))
    return values


@pytest.mark.parametrize("module", sorted(BACKEND_OF_MODULE))
def test_module_helm_values_keep_the_storage_timeouts_of_the_backends_example(module: str) -> None:
    """The Azure module's chart values left out the longer storage deadline (and the grace it
    needs) that helm/cornus/ci/azure-blob-values.yaml gives Azure Blob, so a Terraform install
    ran with the Redis-sized default of 5 s."""
    example = yaml.safe_load(VALUES_FILES[BACKEND_OF_MODULE[module]].read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    values = _applied(_output_value(MODULES / module, "helm_values"), lambda ref: APPLIED_VALUES.get(ref, ref))
    assert values["storage"]["backend"] == example["storage"]["backend"]
    for source in (values, example):
        source.setdefault("timeouts", {})
        source["storage"].setdefault("timeoutMsCall", defaults["storage"]["timeoutMsCall"])
    assert (values["storage"]["timeoutMsCall"], values["timeouts"]) == (
        example["storage"]["timeoutMsCall"], example["timeouts"]), f"modules/{module} helm_values: {values}"


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.iterdir()))
def test_example_root_installs_the_chart_with_a_config_the_node_accepts(helm_bin: str, tmp_path: Path,
                                                                        example: str) -> None:
    """The values each example root's helm_release passes render (the chart's own checks pass),
    and every pod's configuration loads in the node's config loader."""
    values = _example_chart_values(example)
    assert values["storage"]["backend"] == BACKEND_OF_MODULE[example]
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    docs = render(helm_bin, path)
    replicas = find(docs, "StatefulSet", "cornus")["spec"]["replicas"]
    assert replicas == values["replicaCount"]
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    call_ms = values["storage"].get("timeoutMsCall", defaults["storage"]["timeoutMsCall"])
    for ordinal in range(replicas):
        config = load_node_config(environ=pod_environ(node_container(docs), f"cornus-{ordinal}"))
        assert config.storage.backend == BACKEND_OF_MODULE[example]
        assert config.storage.timeout_ms_call == call_ms
