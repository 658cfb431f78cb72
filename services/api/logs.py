"""Structured logs: one JSON object per line, so a log pipeline (Loki, CloudWatch, jq) can filter a
node's lines by transaction without parsing prose.

Lines are written by a thread of their own, from a bounded queue: a log reader that stalls (a pipe
nobody reads, a slow logging driver in blocking mode) would otherwise block the writing call, and
with it the node's event loop and its lease renewals (found by review). Past the queue's bound a
line is dropped and counted, and the writer says how many once it catches up. CRITICAL lines (the
runtime's last words before it exits) are written at once, in the caller, so none is lost, after
the lines queued before them. A line whose record has a true `write_at_once` attribute
(`log.info(..., extra={"write_at_once": True})`, as the ownership serve and stop lines have: a
kill -9 must not lose them) is written at once too, but without waiting for the queue: it may come
before lines logged earlier.

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
import queue
import sys
import threading
import time
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
# Lines waiting for the writer thread (a burst of warnings when storage fails: one per call);
# past it a line is dropped and counted.
LINE_QUEUE_COUNT_MAX = 10_000
# How long an exiting process (logging.shutdown flushes every handler) or a CRITICAL line waits
# for the queued lines to be written.
FLUSH_AT_EXIT_MS_MAX = 1_000
# The record attribute that has a line written in the caller (module docstring).
WRITE_AT_ONCE = "write_at_once"


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


class BackgroundStreamHandler(logging.Handler):
    """Formats in the caller (the transaction context is the caller's), writes in a thread."""

    def __init__(self, stream: TextIO, line_count_max: int = LINE_QUEUE_COUNT_MAX) -> None:
        super().__init__()
        assert line_count_max > 0
        self.stream = stream
        self.lines: queue.Queue[str] = queue.Queue(line_count_max)
        self.dropped_count = 0
        self._dropped_told = 0
        self._stream_lock = threading.Lock()
        self._writer = threading.Thread(target=self._write_lines, name="cornus-log-writer", daemon=True)
        self._writer.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception:  # as logging.StreamHandler does: a bad record must not raise into the caller
            self.handleError(record)
            return
        if record.levelno >= logging.CRITICAL:
            # Last words, before an os._exit that skips atexit: the lines before them first, so
            # that they explain it (found by review), then this one, at once.
            self.flush()
            self._write(line)
            return
        if getattr(record, WRITE_AT_ONCE, False):
            self._write(line)
            return
        try:
            self.lines.put_nowait(line)
        except queue.Full:
            self.dropped_count += 1

    def flush(self, timeout_ms: int = FLUSH_AT_EXIT_MS_MAX) -> None:
        """Wait, at most `timeout_ms`, until every queued line was written."""
        deadline_s = time.monotonic() + timeout_ms / 1000
        while self.lines.unfinished_tasks and time.monotonic() < deadline_s:
            time.sleep(0.01)

    def _write_lines(self) -> None:
        while True:
            line = self.lines.get()
            try:
                self._write(line)
                if self.dropped_count != self._dropped_told and self.lines.empty():
                    dropped, self._dropped_told = self.dropped_count - self._dropped_told, self.dropped_count
                    told = logging.LogRecord("cornus.logs", logging.WARNING, __file__, 0,
                                             "%d log lines dropped: the log reader did not keep up", (dropped,), None)
                    self._write(self.format(told) + "\n")
            finally:
                self.lines.task_done()

    def _write(self, line: str) -> None:
        # The writer thread and a CRITICAL line's caller both write: one line at a time.
        with self._stream_lock, contextlib.suppress(OSError, ValueError):  # a broken stream: nothing to tell
            self.stream.write(line)
            self.stream.flush()


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
    handler = BackgroundStreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(node))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)
    # uvicorn gets log_config=None from serve.py, so its loggers propagate here; these chatty
    # libraries stay at WARNING whatever our level is, as their DEBUG lines carry no txn. The
    # Azure SDK logs every request and answer at INFO: 87% of an Azure node's lines, 20 MB for
    # three nodes in 90 s (found by the chaos tool's Azure runs, 2026-11-28).
    for name in ("asyncio", "grpc", "httpx", "httpcore", "aiosqlite", "azure"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelName(level)))
