"""Toxiproxy: the server process (on 127.0.0.1 only) and the few calls of its HTTP API the harness
needs. Every call has a timeout; a refused call raises ToxiproxyError naming what was asked."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from services.node_launcher import die_with_parent

REPO = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO / "scripts" / "toxiproxy.sh"
# The script's own bound on `go install`, plus the wait for another caller's install lock.
INSTALL_TIMEOUT_S = 1_300.0
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0
# Toxiproxy answers from memory; a call slower than this means it is wedged.
API_TIMEOUT_S = 5.0
POLL_S = 0.05


class ToxiproxyError(RuntimeError):
    pass


def toxiproxy_binary(explicit: str = "") -> str:
    """The server binary: `explicit` if given, else whatever scripts/toxiproxy.sh installed (it
    builds it on first use and prints the path)."""
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise ToxiproxyError(f"--toxiproxy-bin {explicit} is not an executable file")
        return explicit
    try:
        done = subprocess.run(["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True,
                              timeout=INSTALL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise ToxiproxyError(f"{INSTALL_SCRIPT} did not finish within {INSTALL_TIMEOUT_S:g} s") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise ToxiproxyError(f"{INSTALL_SCRIPT} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return lines[-1]


class Toxiproxy:
    """One toxiproxy server. `seed` seeds its own randomness (toxicity draws, jitter)."""

    def __init__(self, binary: str, api_port: int, seed: int, log_path: Path) -> None:
        self.binary = binary
        self.api_port = api_port
        self.seed = seed
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.url = f"http://127.0.0.1:{api_port}"
        self._http = httpx.Client(base_url=self.url, timeout=API_TIMEOUT_S)

    def start(self) -> None:
        assert self.process is None
        parent_pid = os.getpid()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [self.binary, "-host", "127.0.0.1", "-port", str(self.api_port), "-seed", str(self.seed)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                # It logs every connection at info; under a fault schedule that is megabytes a minute.
                env={**os.environ, "LOG_LEVEL": "warn"},
                start_new_session=True,
                # Started before any harness thread exists, so preexec_fn is safe here; if the harness
                # is killed with SIGKILL the kernel still stops the proxy.
                preexec_fn=lambda: die_with_parent(parent_pid),  # noqa: PLW1509
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ToxiproxyError(f"toxiproxy exited at start (code {self.process.returncode}); see {self.log_path}")
            try:
                if self._http.get("/version", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(POLL_S)
        raise ToxiproxyError(f"toxiproxy did not answer on {self.url} within {START_TIMEOUT_S:g} s")

    def stop(self) -> None:
        self._http.close()
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(STOP_TIMEOUT_S)

    def version(self) -> str:
        return self._call("GET", "/version").text.strip()

    # --- proxies and toxics ----------------------------------------------------------------------

    def create_proxy(self, name: str, listen_port: int, upstream: str) -> None:
        self._call("POST", "/proxies", {"name": name, "listen": f"127.0.0.1:{listen_port}", "upstream": upstream,
                                        "enabled": True})

    def set_enabled(self, name: str, enabled: bool) -> None:
        """Disabled, a proxy closes every connection and stops listening: its clients are refused."""
        self._call("POST", f"/proxies/{name}", {"enabled": enabled})

    def add_toxic(self, proxy: str, name: str, kind: str, stream: str, attributes: dict[str, int]) -> None:
        self._call("POST", f"/proxies/{proxy}/toxics",
                   {"name": name, "type": kind, "stream": stream, "toxicity": 1.0, "attributes": attributes})

    def remove_toxic(self, proxy: str, name: str) -> None:
        self._call("DELETE", f"/proxies/{proxy}/toxics/{name}", allow_missing=True)

    def reset(self) -> None:
        """Every proxy enabled, every toxic removed: the end of every network fault at once."""
        self._call("POST", "/reset")

    def proxies(self) -> dict[str, Any]:
        return dict(self._call("GET", "/proxies").json())

    def _call(self, method: str, path: str, body: object = None, *, allow_missing: bool = False) -> httpx.Response:
        try:
            response = self._http.request(method, path, json=body)
        except httpx.HTTPError as error:
            raise ToxiproxyError(f"toxiproxy {method} {path}: {type(error).__name__}: {error}") from error
        if response.status_code == 404 and allow_missing:
            return response
        if response.status_code >= 300:
            raise ToxiproxyError(f"toxiproxy {method} {path} -> {response.status_code}: {response.text[:300]}")
        return response
