"""Runs moto's server (the DynamoDB double the tests use) with one request at a time.

moto's `moto_server` serves each request on its own thread, but its DynamoDB backend is not safe
for that: `TransactWriteItems` deep-copies every table it touches as a rollback backup, so a
concurrent write to the same table makes the copy fail ("dictionary changed size during
iteration", answered as HTTP 500), and a rollback restores a copy that predates the other
thread's write, silently undoing it. Real DynamoDB has neither fault, so the suite must not see
them. This wraps moto's application in a lock and otherwise starts it as `moto_server` does;
threads still accept connections, so a client's idle keep-alive connection never blocks another.

Usage: python3 scripts/moto_serial.py -H 127.0.0.1 -p PORT
"""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.threaded_moto_server import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class SerialApp:
    """A WSGI middleware that lets one request at a time into `app`, body included."""

    def __init__(self, app: WsgiApp) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with self._lock:
            # The body is built inside the lock: a lazy iterable would read moto's state after it.
            return list(self._app(environ, start_response))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args()
    # moto builds some response URLs from this, as its own launcher sets it.
    os.environ.setdefault("MOTO_PORT", str(args.port))
    run_simple(args.host, args.port, SerialApp(DomainDispatcherApplication(create_backend_app)), threaded=True)


if __name__ == "__main__":
    main()
