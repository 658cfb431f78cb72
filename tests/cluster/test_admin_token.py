"""The admin endpoints (`/v1/admin/*`) and the partition listing (`/v1/partitions`) of nodes that
have an admin_token: a call must carry it, and nothing else of the API asks for it
(services/api/admin_auth.py). Real `cornus serve` processes, real HTTP, and the CLI as an operator
runs it.

Found by audit (2026-11-27): the transaction listing and the forced resolve (which aborts a
transaction another client runs) were open to every client of the REST API, with no way to
close them but a proxy in front of the node.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cornus.runtime.config import load_node_config
from loadtests.bench.cluster import owners
from services.client import AsyncCornusClient, CornusClient, InvalidRequest, PartitionInfo, PartitionListing
from services.local_cluster import ClusterNode
from storage_adapters.errors import ValidationError
from tests.cluster.conftest import storage_for
from tests.cluster.harness import Cluster, keys_on, running_cluster, unknown_txn_id
from tests.conftest import Services

TOKEN = "s3cret-admin-token_0123456789"
CLI_TIMEOUT_S = 60.0
NODE_COUNT = 2
PARTITION_COUNT = 2
# What a bad call carries: nothing, another token, the token without its scheme.
REFUSED_HEADERS = ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": TOKEN})


def _cli(args: list[str], token: str | None) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if name != "CORNUS_ADMIN_TOKEN"}
    if token is not None:
        env["CORNUS_ADMIN_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "services.cli", *args], capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, env=env, check=False)


async def _listed_async(url: str) -> list[object]:
    async with AsyncCornusClient(url, admin_token=TOKEN) as client:
        return list(await client.transactions())


async def _partitions_async(url: str, token: str | None) -> tuple[list[PartitionInfo], PartitionListing]:
    async with AsyncCornusClient(url, admin_token=token) as client:
        return await client.partitions(), await client.partition_listing(url)


def _refused(response: httpx.Response, what: object) -> None:
    assert response.status_code == 401, (what, response.text)
    assert response.json()["error"] == "unauthorized" and TOKEN not in response.text
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.fixture(scope="module")
def token_cluster(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Nodes that all have the admin token, shared by this module's tests."""
    storage = storage_for("emulator", services, tmp_path_factory.mktemp("admin-token"))
    with running_cluster("cornus", storage, node_count=NODE_COUNT, partition_count=PARTITION_COUNT) as cluster:
        for node in cluster.nodes.values():
            node.env["CORNUS_ADMIN_TOKEN"] = TOKEN
        cluster.start_all()
        yield cluster


def test_admin_calls_need_the_token_and_nothing_else_does(token_cluster: Cluster) -> None:
    cluster = token_cluster
    url = cluster.nodes["n0"].url
    http = cluster.client
    txn = unknown_txn_id() + ".cornus"
    for method, path in (("GET", "/v1/admin/transactions"), ("GET", "/v1/admin/timings"),
                         ("POST", f"/v1/admin/resolve/{txn}?force=true")):
        for headers in REFUSED_HEADERS:
            _refused(http.request(method, url + path, headers=headers), (path, headers))
        allowed = http.request(method, url + path, headers={"Authorization": f"Bearer {TOKEN}"})
        assert allowed.status_code in (200, 202), (path, allowed.text)  # resolve: an unknown id's outcome
    # Nothing else asks for it: transactions, status, health, readiness, metrics.
    keys = [keys_on("p0", PARTITION_COUNT, 1, prefix="a")[0], keys_on("p1", PARTITION_COUNT, 1, prefix="a")[0]]
    committed = cluster.execute("n0", [{"op": "put", "key": key, "value": "v"} for key in keys])
    assert committed.json()["outcome"] == "committed", committed.text
    for path in (f"/v1/txn/{committed.json()['txn']}", "/healthz", "/readyz", "/metrics"):
        assert http.get(url + path).status_code == 200, path
    schemes = http.get(url + "/openapi.json").json()["components"]["securitySchemes"]
    assert schemes["adminToken"]["scheme"] == "bearer"

    # The SDKs send the token they are given, to the admin calls.
    with CornusClient(url, admin_token=TOKEN) as client:
        assert client.transactions() == []
    with pytest.raises(InvalidRequest, match="admin token"), CornusClient(url) as client:
        client.transactions()
    assert asyncio.run(_listed_async(url)) == []

    # The CLI sends CORNUS_ADMIN_TOKEN; without it the operator is told what is missing.
    listed = _cli(["inspect", "--url", url], TOKEN)
    assert listed.returncode == 0, listed.stderr
    refused_cli = _cli(["inspect", "--url", url], None)
    assert refused_cli.returncode != 0 and "admin token" in refused_cli.stderr, refused_cli.stderr
    resolved = _cli(["resolve", "--url", url, txn], None)
    assert resolved.returncode != 0 and "admin token" in resolved.stderr, resolved.stderr


def test_the_partition_listing_needs_the_token_and_every_caller_sends_it(
        token_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by audit (2026-11-28, second): GET /v1/partitions answered every client of a node that
    has an admin_token, and its answer names `peers`, the addresses of the plain-TCP peer port that
    only nodes should reach; each call also reads storage. It takes the token now, as the admin
    calls do, and every caller sends it: the SDKs, `cornus partitions` and `cornus rebalance` (both
    of its forms), the bench's owner lookup and the Locust users' partition count."""
    cluster = token_cluster
    url = cluster.nodes["n0"].url
    http = cluster.client
    for method in ("GET", "HEAD"):
        for headers in REFUSED_HEADERS:
            refused = http.request(method, url + "/v1/partitions", headers=headers)
            if method == "HEAD":
                assert refused.status_code == 401, (headers, refused.status_code)
            else:
                _refused(refused, headers)
    allowed = http.get(url + "/v1/partitions", headers={"Authorization": f"Bearer {TOKEN}"})
    assert allowed.status_code == 200, allowed.text
    assert allowed.json()["peers"] and len(allowed.json()["partitions"]) == PARTITION_COUNT
    # The published schema says so, for a generated client.
    operation = http.get(url + "/openapi.json").json()["paths"]["/v1/partitions"]["get"]
    assert operation["security"] == [{"adminToken": []}] and "401" in operation["responses"], operation

    with CornusClient(url, admin_token=TOKEN) as client:
        assert len(client.partitions()) == PARTITION_COUNT
        assert client.partition_listing(url).node == "n0"
    with CornusClient(url) as client:
        with pytest.raises(InvalidRequest, match="admin token"):
            client.partitions()
        with pytest.raises(InvalidRequest, match="admin token"):
            client.partition_listing(url)
    rows, listing = asyncio.run(_partitions_async(url, TOKEN))
    assert len(rows) == PARTITION_COUNT and listing.node == "n0"
    with pytest.raises(InvalidRequest, match="admin token"):
        asyncio.run(_partitions_async(url, None))

    shown = _cli(["partitions", "--url", url, "--json"], TOKEN)
    assert shown.returncode == 0, shown.stderr
    assert len(json.loads(shown.stdout)) == PARTITION_COUNT
    refused_cli = _cli(["partitions", "--url", url], None)
    assert refused_cli.returncode != 0 and "admin token" in refused_cli.stderr, refused_cli.stderr
    placed = _cli(["rebalance", "--url", url, "--timeout-s", "30"], TOKEN)
    assert placed.returncode == 0, placed.stderr
    member_urls = ",".join(f"{node.node_id}={node.url}" for node in cluster.nodes.values())
    placed = _cli(["rebalance", "--expect-peers", cluster.peers, "--member-urls", member_urls, "--timeout-s", "30"],
                  TOKEN)
    assert placed.returncode == 0, placed.stdout + placed.stderr

    # The bench's nodes inherit its environment, CORNUS_ADMIN_TOKEN with it; so does its lookup.
    members = [ClusterNode(load_node_config(environ={}, overrides={
        "node_id": node.node_id, "peers": cluster.peers, "partition_count": PARTITION_COUNT}),
        node.api_port, node.peer_port, tmp_path / f"{node.node_id}.log") for node in cluster.nodes.values()]
    monkeypatch.setenv("CORNUS_ADMIN_TOKEN", TOKEN)
    assert sorted(owners(http, members)) == [f"p{i}" for i in range(PARTITION_COUNT)]
    # Locust's users, which take their settings from the environment (loadtests/locust/common.py);
    # a process of its own, as importing Locust patches the interpreter with gevent (first, as the
    # `locust` command does).
    count = subprocess.run(
        [sys.executable, "-c", "import locust; from loadtests.locust.common import partition_count_from as count; "
                               f"print(count({url!r}))"],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False,
        env={**{n: v for n, v in os.environ.items() if n != "CORNUS_PARTITIONS"}, "CORNUS_ADMIN_TOKEN": TOKEN})
    assert count.returncode == 0 and count.stdout.strip() == str(PARTITION_COUNT), count.stdout + count.stderr


def test_a_token_too_short_or_with_other_characters_is_refused_without_being_repeated() -> None:
    base = {"node_id": "n0", "peers": "n0=127.0.0.1:7100", "partition_count": 1}
    for bad in ("short-token", "has a space in it 0123456789", "tab\tin-it-0123456789", "x" * 513):
        with pytest.raises(ValidationError, match="admin_token must be") as refused:
            load_node_config(environ={"CORNUS_ADMIN_TOKEN": bad}, overrides=base)
        assert bad not in str(refused.value)
    config = load_node_config(environ={"CORNUS_ADMIN_TOKEN": TOKEN}, overrides=base)
    assert config.admin_token == TOKEN and TOKEN not in repr(config)
    assert load_node_config(environ={}, overrides=base).admin_token == ""
