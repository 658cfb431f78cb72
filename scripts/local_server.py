"""A server of the test doubles (moto, Azurite) on a free loopback port, for the scripts that
measure them: started in a process group of its own, waited for until it accepts a connection,
and killed with its group when the block ends."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence

READY_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def running(argv: Sequence[str], port: int, environ: Mapping[str, str] | None = None) -> Iterator[int]:
    """Run `argv` (which serves on 127.0.0.1:`port`) for the block; yields its pid."""
    server = subprocess.Popen(list(argv), env=None if environ is None else dict(environ),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"{argv[0]} {argv[1] if len(argv) > 1 else ''} did not start") from None
                time.sleep(0.1)
        yield server.pid
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
