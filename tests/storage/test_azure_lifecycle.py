"""Azure's lifecycle rules against the tombstones the adapter writes: each tombstone must outlive
the keep it was written with, under every rule of the Terraform module (terraform/modules/azure)
that selects it, whatever values the module's variables allow. Found by review: the one tombstone
rule deleted every tombstone a module variable's days after its last write, the node's keep was a
setting of its own, and lowering the variable (Terraform shrinks the rule at once, before the pods
roll) dropped longer-kept tombstones early; a status call then said "not known" (may run again)
of a committed transaction. The rules are evaluated here from the module's HCL (python-hcl2), on
the tags Azurite stores (it has no lifecycle management to run them)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from azure.storage.blob.aio import BlobServiceClient

from storage_adapters import azure_blob
from storage_adapters.azure_blob import DAY_MS
from storage_adapters.contract import (
    CLUSTER_RECORD_TXN,
    TOMBSTONE_KEEP_MS_MAX,
    LogId,
    RecordBody,
    Tombstone,
    TxnState,
)
from storage_adapters.factory import StoreConfig, open_store
from tests.conftest import Services
from tests.deploy.test_terraform import MODULES, blocks, resources, unquote
from tests.storage.conftest import config_for

MODULE = MODULES / "azure"
# Each side of each whole day a keep may fall on, up to the longest keep there is.
KEEPS_MS = sorted({1, 60_000, DAY_MS - 1, DAY_MS, DAY_MS + 1, 3 * DAY_MS + 5, 6 * DAY_MS + 1,
                   TOMBSTONE_KEEP_MS_MAX - 1, TOMBSTONE_KEEP_MS_MAX})
_REFERENCE = re.compile(r"^\$\{(?P<ref>[^{}]+)\}$")


def _smallest_allowed(variable: str) -> int:
    """The fewest days a module variable may be set to (its validation's `>= n`): what a user may
    lower it to at any time."""
    (validation,) = blocks(MODULE, "variable")[variable]["validation"]
    (low,) = re.findall(rf"var\.{variable} >= (\d+)", validation["condition"])
    return int(low)


def _days(value: Any, bindings: dict[str, str]) -> int:
    """The fewest days a rule's `delete_after_days_since_modification_greater_than` can be."""
    if isinstance(value, int):
        return value
    reference = _REFERENCE.match(str(value))
    assert reference is not None, f"a rule's days must be a number or a reference, got {value!r}"
    ref = reference["ref"]
    if ref.startswith("var."):
        return _smallest_allowed(ref.removeprefix("var."))
    assert ref in bindings, f"unknown reference {ref} in a rule's days"
    return int(bindings[ref])


def _expanded_rules() -> list[tuple[dict[str, Any], dict[str, str]]]:
    """Every rule of the module's policy, a `dynamic "rule"` once per value of its for_each (a
    local list), each with what `rule.value` stands for in it."""
    (policy,) = resources(MODULE, "azurerm_storage_management_policy").values()
    rules: list[tuple[dict[str, Any], dict[str, str]]] = [(rule, {}) for rule in policy.get("rule", [])]
    for dynamic in policy.get("dynamic", []):
        (block,) = dynamic.values()
        reference = _REFERENCE.match(block["for_each"])
        assert reference is not None and reference["ref"].startswith("local."), block["for_each"]
        values = blocks(MODULE, "locals")[reference["ref"].removeprefix("local.")]
        (content,) = block["content"]
        rules += [(content, {"rule.value": str(value)}) for value in values]
    return rules


def _rule_name(rule: dict[str, Any], bindings: dict[str, str]) -> str:
    name = str(unquote(rule["name"]))
    for ref, value in bindings.items():
        name = name.replace("${" + ref + "}", value)
    return name


def _tag_value(value: Any, bindings: dict[str, str]) -> str:
    reference = _REFERENCE.match(str(unquote(value)))
    return bindings[reference["ref"]] if reference else str(unquote(value))


def _prefix(value: Any, container: str) -> str:
    """A rule's prefix_match, resolved: `<container>/...`, through the module's locals."""
    text = str(unquote(value))
    reference = _REFERENCE.match(text)
    if reference is not None:
        assert reference["ref"].startswith("local."), text
        text = str(unquote(blocks(MODULE, "locals")[reference["ref"].removeprefix("local.")]))
    return text.replace("${var.container_name}", container)


def _deleting_rules(container: str, blob: str, tags: dict[str, str]) -> dict[str, int]:
    """Each rule that selects the blob `blob` of `container` with these blob index tags, and the
    fewest days after its last write at which it deletes it."""
    selected = {}
    for rule, bindings in _expanded_rules():
        (filters,) = rule["filters"]
        if not any(f"{container}/{blob}".startswith(_prefix(prefix, container)) for prefix in filters["prefix_match"]):
            continue
        wanted = {unquote(tag["name"]): _tag_value(tag["value"], bindings)
                  for tag in filters.get("match_blob_index_tag", [])}
        assert all(unquote(tag["operation"]) == "==" for tag in filters.get("match_blob_index_tag", []))
        if all(tags.get(name) == value for name, value in wanted.items()):
            (actions,) = rule["actions"]
            (base_blob,) = actions["base_blob"]
            selected[_rule_name(rule, bindings)] = _days(
                base_blob["delete_after_days_since_modification_greater_than"], bindings)
    return selected


@pytest.fixture
async def store(services: Services, run_id: str, tmp_path: Path) -> AsyncIterator[azure_blob.AzureBlobStore]:
    config: StoreConfig = config_for("azure_blob", services, run_id, str(tmp_path))
    opened = await open_store(config)
    assert isinstance(opened, azure_blob.AzureBlobStore)
    try:
        yield opened
    finally:
        await opened.close()


async def test_every_tombstone_outlives_its_keep_under_every_rule_that_selects_it_whatever_the_variables(
    store: azure_blob.AzureBlobStore, services: Services, ns: str,
) -> None:
    service = BlobServiceClient.from_connection_string(services.azure_connection_string, retry_total=0)
    try:
        container = service.get_container_client(store._container.container_name)
        for index, keep_ms in enumerate(KEEPS_MS):
            log = LogId.partition(f"{ns}-{index}")
            await store.log_once(log, "t", TxnState.VOTE_YES, RecordBody((log.name,), "n0", b""))
            assert await store.delete(log, "t", keep=Tombstone(TxnState.ABORT, keep_ms)) is True
            name = azure_blob._record_name(log, "t")
            tags = await container.get_blob_client(name).get_blob_tags()
            rules = _deleting_rules(container.container_name, name, tags)
            # Deleted in the end (no leak), by its own days, rounded up to whole days, and never
            # earlier than its keep by any rule.
            assert rules, f"no rule ever deletes a tombstone tagged {tags}"
            assert min(rules.values()) == -(-keep_ms // DAY_MS), (keep_ms, tags, rules)
            for name, days in rules.items():
                assert days * DAY_MS >= keep_ms, f"rule {name} deletes a tombstone kept {keep_ms} ms after {days} days"
            # A record that is no tombstone carries no tag a tombstone rule selects it by.
            await store.log_once(log, "voted", TxnState.VOTE_YES, RecordBody((log.name,), "n0", b""))
            name = azure_blob._record_name(log, "voted")
            voted = await container.get_blob_client(name).get_blob_tags()
            assert set(_deleting_rules(container.container_name, name, voted)) == {"delete-old-transaction-records"}
    finally:
        await service.close()


async def test_no_rule_ever_deletes_the_cluster_record(store: azure_blob.AzureBlobStore, services: Services) -> None:
    """The cluster record (cornus/runtime/cluster_record.py) is written once and never rewritten,
    and must last as long as the data, which no rule deletes: a record the rule of old transaction
    records swept (found by review: it lay under txn/, 30 days by default) would let the next node
    record another partition count over the same data."""
    await store.log_once(LogId.cluster(), CLUSTER_RECORD_TXN, TxnState.COMMIT, RecordBody(redo=b"{}"))
    name = azure_blob._record_name(LogId.cluster(), CLUSTER_RECORD_TXN)
    service = BlobServiceClient.from_connection_string(services.azure_connection_string, retry_total=0)
    try:
        container = service.get_container_client(store._container.container_name)
        tags = await container.get_blob_client(name).get_blob_tags()
        assert _deleting_rules(container.container_name, name, tags) == {}, name
        # The data it describes is kept as long: no rule selects a data blob either.
        assert _deleting_rules(container.container_name, "data/p0/aw", {}) == {}
    finally:
        await service.close()
