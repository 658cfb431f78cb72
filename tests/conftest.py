"""Shared fixtures: where the real services started by `scripts/services.sh up` listen.

A test that needs a service and cannot reach it FAILS (never skips): a skipped storage test would
let a broken backend pass CI unseen.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.worker import claim_redis_slot

REPO = Path(__file__).resolve().parent.parent
SERVICES_ENV = Path(os.environ.get("CORNUS_SERVICES_DIR", REPO / ".services")) / "env"

# moto accepts any credentials; set them before any AWS client is made, in this process and in
# the processes tests spawn, so nothing looks for a real account.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")


def _services_env() -> dict[str, str]:
    values: dict[str, str] = {}
    if SERVICES_ENV.exists():
        for line in SERVICES_ENV.read_text().splitlines():
            name, sep, value = line.partition("=")
            if sep:
                values[name] = value.strip("'")
    # Variables set by the caller win over the file, so a developer can point at other servers.
    values.update({name: value for name, value in os.environ.items() if name.startswith("CORNUS_")})
    return values


def _require_port(url: str, what: str) -> None:
    parsed = urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port
    assert port is not None, f"{what}: no port in {url!r}"
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError as error:
        pytest.fail(f"{what} is not reachable at {host}:{port} ({error}); run `scripts/services.sh up`")


class Services:
    """Addresses of the shared test services, checked reachable on first use."""

    def __init__(self) -> None:
        self.env = _services_env()

    def get(self, name: str) -> str:
        if name not in self.env:
            pytest.fail(f"{name} is not set and {SERVICES_ENV} lacks it; run `scripts/services.sh up`")
        return self.env[name]

    @property
    def redis_url(self) -> str:
        url = self.get("CORNUS_TEST_REDIS_URL")
        _require_port(url, "redis")
        return url

    @property
    def azure_connection_string(self) -> str:
        value = self.get("CORNUS_TEST_AZURE_CONNECTION_STRING")
        endpoint = dict(part.split("=", 1) for part in value.split(";") if "=" in part)["BlobEndpoint"]
        _require_port(endpoint, "azurite")
        return value

    @property
    def dynamodb_endpoint(self) -> str:
        url = self.get("CORNUS_TEST_DYNAMODB_ENDPOINT")
        _require_port(url, "moto server")
        return url


@pytest.fixture(scope="session")
def services() -> Services:
    return Services()


# Fixtures that start a real cluster once per session (or module) and share it between tests.
# Under pytest-xdist every worker running one of those tests would start its own: the tests
# sharing one form an xdist group (`--dist loadgroup`, scripts/test.sh), so it starts once. Named
# after the fixture and its directory, as tests/client and tests/api_grpc each define `cluster`.
SHARED_CLUSTER_FIXTURES = frozenset({"api_cluster", "cluster"})


def pytest_configure(config: pytest.Config) -> None:
    # Before xdist starts its workers, so they inherit the run's slot (tests/worker.py).
    claim_redis_slot()


# First: xdist's own hook of the same name reads the group markers to name each test's group, so
# they must be on the items by then (after it, every worker started the shared cluster again).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for name in SHARED_CLUSTER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group(f"{item.path.parent.name}-{name}"))


# `CORNUS_TEST_TIMELINE=FILE`: each test's worker, start and end (wall-clock seconds, setup to
# teardown), and the CPU seconds it spent in the worker and in the child processes it waited for
# (CLI and bench processes and what they started; not the services, nor the nodes a node launcher
# forked: each launcher appends those to FILE.nodes, with the test that started them,
# services/node_launcher.py) appended to FILE as tab-separated lines: what tells which tests make
# the suite's tail when its wall time is over budget, and, since the suite is bound by CI's two
# cores, which tests spend them (scripts/timeline.py reads it).
_TIMELINE = os.environ.get("CORNUS_TEST_TIMELINE", "")


if _TIMELINE:
    import resource
    import time

    def _cpu_s(who: int) -> float:
        usage = resource.getrusage(who)
        return usage.ru_utime + usage.ru_stime

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
        started = time.time()
        cpu_self_s = _cpu_s(resource.RUSAGE_SELF)
        cpu_children_s = _cpu_s(resource.RUSAGE_CHILDREN)
        yield
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        cpu_self_s = _cpu_s(resource.RUSAGE_SELF) - cpu_self_s
        cpu_children_s = _cpu_s(resource.RUSAGE_CHILDREN) - cpu_children_s
        with open(_TIMELINE, "a") as timeline:
            timeline.write(
                f"{worker}\t{started:.3f}\t{time.time():.3f}\t{item.nodeid}"
                f"\t{cpu_self_s:.2f}\t{cpu_children_s:.2f}\n"
            )
