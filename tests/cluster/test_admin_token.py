"""The admin endpoints (`/v1/admin/*`) of nodes that have an admin_token: a call must carry it, and
nothing else of the API asks for it (services/api/admin_auth.py). Real `cornus serve` processes,
real HTTP, and the CLI as an operator runs it.

Found by audit (2026-11-27): the transaction listing and the forced resolve (which aborts a
transaction another client runs) were open to every client of the REST API, with no way to
close them but a proxy in front of the node.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cornus.runtime.config import load_node_config
from services.client import AsyncCornusClient, CornusClient, InvalidRequest
from storage_adapters.errors import ValidationError
from tests.cluster.conftest import storage_for
from tests.cluster.harness import keys_on, running_cluster, unknown_txn_id
from tests.conftest import Services

TOKEN = "s3cret-admin-token_0123456789"
CLI_TIMEOUT_S = 60.0


def _cli(args: list[str], token: str | None) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if name != "CORNUS_ADMIN_TOKEN"}
    if token is not None:
        env["CORNUS_ADMIN_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "services.cli", *args], capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, env=env, check=False)


async def _listed_async(url: str) -> list[object]:
    async with AsyncCornusClient(url, admin_token=TOKEN) as client:
        return list(await client.transactions())


def test_admin_calls_need_the_token_and_nothing_else_does(services: Services, tmp_path: Path) -> None:
    with running_cluster("cornus", storage_for("emulator", services, tmp_path), node_count=2,
                         partition_count=2) as cluster:
        for node in cluster.nodes.values():
            node.env["CORNUS_ADMIN_TOKEN"] = TOKEN
        cluster.start_all()
        url = cluster.nodes["n0"].url
        http = cluster.client
        txn = unknown_txn_id() + ".cornus"
        for method, path in (("GET", "/v1/admin/transactions"), ("GET", "/v1/admin/timings"),
                             ("POST", f"/v1/admin/resolve/{txn}?force=true")):
            for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": TOKEN}):
                refused = http.request(method, url + path, headers=headers)
                assert refused.status_code == 401, (path, headers, refused.text)
                assert refused.json()["error"] == "unauthorized" and TOKEN not in refused.text
                assert refused.headers["WWW-Authenticate"].startswith("Bearer")
            allowed = http.request(method, url + path, headers={"Authorization": f"Bearer {TOKEN}"})
            assert allowed.status_code in (200, 202), (path, allowed.text)  # resolve: an unknown id's outcome
        # Nothing else asks for it: transactions, status, health, readiness, partitions, metrics.
        keys = [keys_on("p0", 2, 1, prefix="a")[0], keys_on("p1", 2, 1, prefix="a")[0]]
        committed = cluster.execute("n0", [{"op": "put", "key": key, "value": "v"} for key in keys])
        assert committed.json()["outcome"] == "committed", committed.text
        for path in (f"/v1/txn/{committed.json()['txn']}", "/healthz", "/readyz", "/v1/partitions", "/metrics"):
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


def test_a_token_too_short_or_with_other_characters_is_refused_without_being_repeated() -> None:
    base = {"node_id": "n0", "peers": "n0=127.0.0.1:7100", "partition_count": 1}
    for bad in ("short-token", "has a space in it 0123456789", "tab\tin-it-0123456789", "x" * 513):
        with pytest.raises(ValidationError, match="admin_token must be") as refused:
            load_node_config(environ={"CORNUS_ADMIN_TOKEN": bad}, overrides=base)
        assert bad not in str(refused.value)
    config = load_node_config(environ={"CORNUS_ADMIN_TOKEN": TOKEN}, overrides=base)
    assert config.admin_token == TOKEN and TOKEN not in repr(config)
    assert load_node_config(environ={}, overrides=base).admin_token == ""
