"""Structured logs: one JSON object per line, so a log pipeline (Loki, CloudWatch, jq) can filter a
node's lines by transaction without parsing prose.

Every line carries `ts`, `level`, `logger`, `msg` and `node`; a line logged while a transaction is
being handled also carries `txn`. The id comes from, in order: a `txn` attribute on the record
(`log.info(..., extra={"txn": txn})`, which any layer can set without importing this module, so the
runtime needs no dependency on services), else the `current_txn` context variable that the REST
handlers set. asyncio copies the context into the tasks a handler spawns, so storage calls started
while handling a commit inherit its id.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import TextIO

# The transaction the current task is working for ("" when none).
current_txn: contextvars.ContextVar[str] = contextvars.ContextVar("cornus_txn", default="")

# The level when CORNUS_LOG_LEVEL is unset. Committed transactions log at DEBUG: one line per commit
# at INFO would cost more than the commit's own bookkeeping at tens of thousands of commits/s.
LOG_LEVEL_DEFAULT = "INFO"
LOG_LEVEL_ENV = "CORNUS_LOG_LEVEL"
# A runaway message (a huge repr) must not turn one log line into megabytes.
MESSAGE_BYTES_MAX = 16 * 1024

_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@contextlib.contextmanager
def txn_context(txn: str) -> Iterator[None]:
    """Tag every line logged inside the block (and in tasks it spawns) with `txn`."""
    assert txn, "a transaction id is never empty"
    token = current_txn.set(txn)
    try:
        yield
    finally:
        current_txn.reset(token)


class JsonFormatter(logging.Formatter):
    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if len(message) > MESSAGE_BYTES_MAX:
            message = message[:MESSAGE_BYTES_MAX] + "...(truncated)"
        line: dict[str, object] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": message,
            "node": self.node,
        }
        txn = getattr(record, "txn", None) or current_txn.get()
        if txn:
            line["txn"] = str(txn)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        # default=str: a non-JSON value in a message argument must not lose the line.
        return json.dumps(line, ensure_ascii=False, default=str)


def level_from_env(environ: dict[str, str] | None = None) -> str:
    """CORNUS_LOG_LEVEL (DEBUG, INFO, WARNING, ERROR, CRITICAL), else INFO; anything else is an error."""
    level = (os.environ if environ is None else environ).get(LOG_LEVEL_ENV, LOG_LEVEL_DEFAULT).strip().upper()
    if level not in _LEVELS:
        raise ValueError(f"{LOG_LEVEL_ENV}={level!r}: expected one of {', '.join(_LEVELS)}")
    return level


def configure_json_logging(node: str, level: str = LOG_LEVEL_DEFAULT, stream: TextIO | None = None) -> None:
    """Route every logger of the process through one JSON handler, replacing whatever handlers the
    root logger had (a plain basicConfig from the CLI would otherwise print each line twice)."""
    assert level in _LEVELS, level
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(node))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)
    # uvicorn gets log_config=None from serve.py, so its loggers propagate here; these chatty
    # libraries stay at WARNING whatever our level is, as their DEBUG lines carry no txn.
    for name in ("asyncio", "grpc", "httpx", "httpcore", "aiosqlite"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelName(level)))
