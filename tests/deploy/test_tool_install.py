"""A cold install of a deployment tool is not charged to the timeout of the test that needs it
first (tests/deploy/conftest.py times only the test function of tests that use a tool fixture).

A cold `go install` of helm takes about 180 s here, and more on a loaded machine, against a
per-test timeout of 300 s: the first chart test of a fresh machine could fail for a slow build,
not for anything it checks. Here a pytest run of its own meets a simulated cold build (a `go`
that waits, then delivers the helm binary) longer than the per-test timeout it is given.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.deploy.conftest import REPO

# The simulated cold build, and the per-test timeout of the inner run: shorter than the build,
# ample for the test itself (`helm lint` of the chart takes well under a second).
FAKE_INSTALL_S = 5
TEST_TIMEOUT_S = 3
# The inner run: the interpreter's start and collection, the install, the test.
RUN_TIMEOUT_S = 120.0
OUTPUT_TAIL_CHARS = 3_000


def test_a_slow_helm_install_does_not_time_out_the_first_test_that_needs_it(helm_bin: str, tmp_path: Path) -> None:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    go = fake_bin / "go"
    go.write_text(f'#!/bin/sh\n# A cold `go install` of helm, without the CPU: wait, then deliver the binary.\n'
                  f'sleep {FAKE_INSTALL_S}\ncp "{helm_bin}" "$GOBIN/helm"\n')
    go.chmod(0o755)
    tools = tmp_path / "tools"
    # The inner run's own settings only: none of this run's pytest options or xdist identity.
    environ = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_")}
    # Only the timeout plugin: the others (hypothesis, schemathesis, xdist, ...) cost the inner
    # interpreter seconds of CPU to load on a loaded CI run, for a test that uses none of them.
    environ.update({"PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}", "CORNUS_TOOLS_DIR": str(tools),
                    "PYTHONPATH": str(REPO), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "pytest_timeout",
         "-o", f"timeout={TEST_TIMEOUT_S}",
         "tests/deploy/test_helm_chart.py::test_lint_strict_defaults"],
        cwd=REPO, env=environ, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
    )
    output = (done.stdout + done.stderr)[-OUTPUT_TAIL_CHARS:]
    assert done.returncode == 0, f"the first helm test failed behind a {FAKE_INSTALL_S} s install:\n{output}"
    assert "1 passed" in done.stdout, output
    assert list(tools.glob("helm-*/bin/helm")), f"the simulated install did not run:\n{output}"
