"""The image's environment against the node's own configuration: a node reads a --config file, then
CORNUS_* variables over it (cornus/runtime/config.py), so whatever the image sets as a variable
beats the user's file. These load a node's configuration with exactly the image's ENV pairs, and
run the image's HEALTHCHECK command against a node configured by a file alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cornus.runtime.config import load_node_config
from tests.deploy.conftest import REPO
from tests.worker import free_port

DOCKERFILE = REPO / "Dockerfile"
# A node over the embedded emulator serves within a storage deadline of its start (set short in
# the file below), slower on a loaded machine.
TIMEOUT_S_READY = 60.0
TIMEOUT_S_COMMAND = 30.0
TIMEOUT_S_STOP = 60.0
POLL_S = 0.1
HTTP_TIMEOUT_S = 2.0
# The storage deadline of the node below: a starting node waits one out before it serves.
STORAGE_TIMEOUT_MS_CALL = 500


def image_environ() -> dict[str, str]:
    """The ENV pairs of the image's final stage, as a container starts with them."""
    final = DOCKERFILE.read_text().rsplit("\nFROM ", 1)[1].replace("\\\n", " ")
    environ: dict[str, str] = {}
    for line in final.splitlines():
        words = line.split(None, 1)
        if words[:1] != ["ENV"]:
            continue
        for pair in shlex.split(words[1]):
            name, sep, value = pair.partition("=")
            assert sep, f"ENV {pair}: only the NAME=VALUE form is read here"
            environ[name] = value
    return environ


def _write_file_config(path: Path, api_port: int, peer_port: int) -> Path:
    path.write_text(
        'node_id = "n0"\n'
        "partition_count = 1\n"
        f'api_listen = "127.0.0.1:{api_port}"\n'
        "[peers]\n"
        f'n0 = "127.0.0.1:{peer_port}"\n'
        "[storage]\n"
        f"timeout_ms_call = {STORAGE_TIMEOUT_MS_CALL}\n"
    )
    return path


def test_a_mounted_config_file_wins_over_the_image_defaults(tmp_path: Path) -> None:
    """Found by audit (2026-11-28, second): the image set CORNUS_LISTEN, CORNUS_API_LISTEN and
    CORNUS_GRPC_API_LISTEN, and variables override a --config file, so a mounted file's listen
    addresses were silently replaced: its REST API on 127.0.0.1 went to 0.0.0.0, and the public
    gRPC API it left off was switched on. The file's values win now."""
    path = _write_file_config(tmp_path / "node.toml", 8080, 7200)
    config = load_node_config(path, environ=image_environ())
    assert config.api_listen == "127.0.0.1:8080"
    assert config.listen == "127.0.0.1:7200"
    assert config.grpc_api_listen == "", "the file left the public gRPC API off"


def test_a_node_configured_by_variables_alone_listens_on_its_peers_entry() -> None:
    """Found by audit (2026-11-28, second): with CORNUS_LISTEN in the image, a node given its
    CORNUS_* variables but no CORNUS_LISTEN listened on 0.0.0.0:7100, not on its peers entry, the
    documented fallback (cornus/runtime/config.py), whatever port the peers list named."""
    environ = {**image_environ(), "CORNUS_NODE_ID": "n0", "CORNUS_PEERS": "n0=10.0.0.5:7300,n1=10.0.0.6:7300",
               "CORNUS_PARTITION_COUNT": "2", "CORNUS_API_LISTEN": "0.0.0.0:8100"}
    assert load_node_config(environ=environ).listen == "10.0.0.5:7300"


def _healthcheck_command() -> list[str]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if line.split(None, 1)[:1] == ["HEALTHCHECK"]]
    command: list[str] = json.loads(line.split(" CMD ", 1)[1])
    return command


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"


@pytest.fixture
def file_node(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """`cornus serve --config FILE` over the emulator, configured by the file alone (no CORNUS_*
    variable), started by a shell that stays its parent as an init would (`docker run --init`);
    the shell's pid and the node's, once it serves. Both are stopped at the end."""
    api_port, peer_port = free_port(), free_port()
    path = _write_file_config(tmp_path / "node.toml", api_port, peer_port)
    environ = {name: value for name, value in os.environ.items() if not name.startswith("CORNUS_")}
    log = (tmp_path / "node.log").open("wb")
    # In the background and waited for, so the shell does not hand its process to the node.
    serve = f"{shlex.quote(sys.executable)} -m services.cli serve --config node.toml & wait $!"
    shell = subprocess.Popen(["sh", "-c", serve], cwd=tmp_path, env=environ, stdin=subprocess.DEVNULL,
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    node_pid = 0
    try:
        deadline = time.monotonic() + TIMEOUT_S_READY
        while True:
            assert shell.poll() is None, (tmp_path / "node.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"not ready within {TIMEOUT_S_READY:g} s: {path.read_text()}"
            try:
                if httpx.get(f"http://127.0.0.1:{api_port}/readyz", timeout=HTTP_TIMEOUT_S).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(POLL_S)
        (node_pid,) = map(int, Path(f"/proc/{shell.pid}/task/{shell.pid}/children").read_text().split())
        yield shell.pid, node_pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGTERM)
        shell.wait(TIMEOUT_S_STOP)
        deadline = time.monotonic() + TIMEOUT_S_STOP
        while node_pid and not _gone(node_pid) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if node_pid and not _gone(node_pid):
            os.kill(node_pid, signal.SIGKILL)
        log.close()


def test_the_healthcheck_asks_the_node_where_its_configuration_says(file_node: tuple[int, int]) -> None:
    """Found by audit (2026-11-28, second): the HEALTHCHECK read the REST port from
    CORNUS_API_LISTEN, which only the image's own default set; a node whose file names its REST
    address (or one without that variable, once the image stops setting it) was reported
    unhealthy, or the check failed on a missing variable. It now builds the node's configuration
    as the node did (its command line, environment and working directory) and asks that address,
    found under an init too."""
    command = _healthcheck_command()
    assert command[:2] == ["cornus", "healthcheck"], command
    assert "CORNUS_API_LISTEN" not in " ".join(command)
    shell_pid, node_pid = file_node
    # The check runs beside the node, with nothing of its environment: it finds the node by pid
    # (1 in the image, the default).
    clean = {name: value for name, value in os.environ.items() if not name.startswith("CORNUS_")}

    def check(pid: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "services.cli", *command[1:], "--pid", str(pid)],
                              capture_output=True, text=True, timeout=TIMEOUT_S_COMMAND, check=False, env=clean)

    for pid in (node_pid, shell_pid):
        done = check(pid)
        assert done.returncode == 0, (pid, done.stdout + done.stderr)
    os.kill(node_pid, signal.SIGTERM)
    deadline = time.monotonic() + TIMEOUT_S_STOP
    while not _gone(node_pid) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    done = check(node_pid)
    assert done.returncode == 1, done.stdout + done.stderr
