"""Tools and renders for the deployment tests: the helm CLI (scripts/helm.sh builds it from its Go
module, once per machine; scripts/test.sh starts that build in the background at suite start),
checkov (scripts/checkov.sh, a virtual environment of its own), and `helm template` of the chart
with a values file.

A tool that cannot be installed FAILS the test that needs it, with the installer's output: these
checks are the only evidence the chart and the Terraform are sound, so they never skip.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "cornus"
CI_VALUES = CHART / "ci"
TERRAFORM = REPO / "terraform"
# Each backend's example values file, and the dev install (the chart's own Redis).
VALUES_FILES = {
    "redis": CI_VALUES / "redis-values.yaml",
    "azure_blob": CI_VALUES / "azure-blob-values.yaml",
    "dynamodb": CI_VALUES / "dynamodb-values.yaml",
    "emulator": CI_VALUES / "emulator-values.yaml",
    "dev_redis": CI_VALUES / "dev-redis-values.yaml",
}
RELEASE = "cornus"
NAMESPACE = "cornus"
# The Kubernetes version `helm template` assumes (its own default, 1.20, is long out of support).
KUBE_VERSION = "1.33.0"
# A cold `go install` of helm takes about 2 minutes on 2 cores; scripts/helm.sh bounds its own
# build at 900 s and the wait for another caller's lock at as much again.
INSTALL_TIMEOUT_S = 1_900.0
HELM_TIMEOUT_S = 60.0


def install_tool(script: str) -> str:
    """Run scripts/<script> (build or find the tool) and return the path it prints."""
    try:
        done = subprocess.run(["bash", str(REPO / "scripts" / script)], capture_output=True, text=True,
                              timeout=INSTALL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"scripts/{script} did not finish within {INSTALL_TIMEOUT_S:g} s")
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        pytest.fail(f"scripts/{script} could not install its tool (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return lines[-1]


# Fixtures that may install a tool on first use (a cold `go install` of helm takes ~180 s here,
# more on a loaded machine; checkov builds a virtual environment). Their wait is bounded by
# INSTALL_TIMEOUT_S, not by the per-test timeout (pyproject.toml, 300 s), which would otherwise
# charge the install to whichever test happens to need the tool first and fail it.
TOOL_FIXTURES = frozenset({"helm_bin", "checkov_bin"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Time only the test function (not its fixtures) of every test of this directory that uses
    a tool fixture: the test keeps its timeout, the install is bounded by its own."""
    here = Path(__file__).parent
    for item in items:
        if here not in item.path.parents or not TOOL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            continue
        marker = item.get_closest_marker("timeout")
        args, kwargs = (marker.args, marker.kwargs) if marker is not None else ((), {})
        # Prepended, so it is the closest timeout marker; any timeout a test sets is kept.
        item.add_marker(pytest.mark.timeout(*args, **{**kwargs, "func_only": True}), append=False)


@pytest.fixture(scope="session")
def helm_bin() -> str:
    return install_tool("helm.sh")


@pytest.fixture(scope="session")
def checkov_bin() -> str:
    return install_tool("checkov.sh")


def run_helm(helm: str, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=HELM_TIMEOUT_S, check=False)


def render(helm: str, values: Path | None = None, sets: Sequence[str] = (), *, release: str = RELEASE,
           namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """`helm template` of the chart (its test hooks included), parsed; fails the test with helm's
    message if rendering fails."""
    args = ["template", release, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION]
    if values is not None:
        args += ["-f", str(values)]
    for item in sets:
        args += ["--set", item]
    done = run_helm(helm, args)
    assert done.returncode == 0, f"helm template {' '.join(args[3:])} failed:\n{done.stderr}"
    return parse_manifests(done.stdout)


def parse_manifests(text: str) -> list[dict[str, Any]]:
    """The documents of a rendered chart. With libyaml's parser: the pure-Python one took a third
    of each of the suite's hundred-odd renders' CPU."""
    return [doc for doc in yaml.load_all(text, Loader=yaml.CSafeLoader) if doc]


def render_error(helm: str, values: Path | None = None, sets: Sequence[str] = ()) -> str:
    """helm's error for a render that must fail (asserts that it does)."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION]
    if values is not None:
        args += ["-f", str(values)]
    for item in sets:
        args += ["--set", item]
    done = run_helm(helm, args)
    assert done.returncode != 0, f"helm template {' '.join(args[3:])} should have been refused"
    return done.stderr


def find(docs: Sequence[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [doc for doc in docs if doc["kind"] == kind and doc["metadata"]["name"] == name]
    names = [doc["metadata"]["name"] for doc in docs if doc["kind"] == kind]
    assert len(matches) == 1, f"expected one {kind} {name}, found {names}"
    return matches[0]
