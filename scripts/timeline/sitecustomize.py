"""Timestamps of a node's socket traffic, for scripts/timeline.sh (loaded through PYTHONPATH by
every `cornus serve` the bench starts; inert unless CORNUS_TIMELINE_DIR is set).

Each hook appends (perf_counter seconds, node, event, bytes) to a list in memory between SIGUSR1
and SIGUSR2, and SIGUSR2 writes the list to CORNUS_TIMELINE_DIR/<node>.txt. perf_counter is
CLOCK_MONOTONIC on Linux, so the files of the node processes merge into one timeline. The hooks
wrap private functions of uvicorn and of our transports: a diagnostic, kept beside the code it
reads, not an interface.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

_DIR = os.environ.get("CORNUS_TIMELINE_DIR", "")


def _install(directory: str, node: str) -> None:
    from uvicorn.protocols.http import httptools_impl

    import services.node_rpc.transport as peer
    from services.api import rest
    from storage_adapters import resp_pipe

    records: list[tuple[float, str, str, int]] = []
    recording = [False]
    clock = time.perf_counter

    def mark(event: str, size: int = 0) -> None:
        if recording[0]:
            records.append((clock(), node, event, size))

    def before(owner: Any, name: str, event: str, size_of: Any = None) -> None:
        original = getattr(owner, name)

        def hooked(self: Any, *args: Any) -> Any:
            mark(event, size_of(self, *args) if size_of else 0)
            return original(self, *args)

        setattr(owner, name, hooked)

    execute_fast_path = rest._ExecuteFastPath.__call__

    # The ASGI signature spelled out: uvicorn takes an app callable with no arguments for a factory.
    async def asgi(self: Any, scope: Any, receive: Any, send: Any) -> None:
        mark("asgi")
        await execute_fast_path(self, scope, receive, send)

    rest._ExecuteFastPath.__call__ = asgi

    before(httptools_impl.HttpToolsProtocol, "data_received", "http_in", lambda self, data: len(data))
    before(peer._FrameConnection, "write_frames", "peer_out", lambda self, frames: sum(map(len, frames)))
    before(peer._FrameConnection, "data_received", "peer_in", lambda self, data: len(data))
    before(resp_pipe.RespPipe, "_flush", "redis_out", lambda self: sum(map(len, self._outgoing)))
    before(resp_pipe._Protocol, "data_received", "redis_in", lambda self, data: len(data))
    # A response's last part, as the app hands it to uvicorn (which writes it at once).
    before(httptools_impl.RequestResponseCycle, "send", "http_out",
           lambda self, message: len(message.get("body", b"")) if message["type"] == "http.response.body"
           and not message.get("more_body") else -1)

    def start(*_: Any) -> None:
        recording[0] = True

    def stop(*_: Any) -> None:
        recording[0] = False
        with open(os.path.join(directory, f"{node}.txt"), "w") as out:
            for moment, who, event, size in records:
                if size >= 0:  # -1: a write that was not a response leaving
                    out.write(f"{moment:.6f} {who} {event} {size}\n")

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)


if _DIR and "serve" in sys.argv and "--node-id" in sys.argv:
    _install(_DIR, sys.argv[sys.argv.index("--node-id") + 1])
