"""The node's log lines are written by a thread of their own (services/api/logs.py): a log reader
that stalls costs dropped lines, never a blocked event loop (found by review: with stderr a pipe
nobody read, the 337th line blocked the node, lease renewals included)."""

from __future__ import annotations

import io
import json
import logging
import os
import threading

from services.api.logs import BackgroundStreamHandler, JsonFormatter, configure_json_logging

LINE_COUNT = 5_000
# How long the test gives the logging calls before it calls them blocked (they take milliseconds).
BLOCKED_S = 10.0


def _logger(handler: logging.Handler, name: str) -> logging.Logger:
    handler.setFormatter(JsonFormatter("n0"))
    logger = logging.getLogger(name)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.handlers = [handler]
    return logger


def test_a_reader_that_stalls_costs_lines_not_the_caller() -> None:
    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w")
    handler = BackgroundStreamHandler(stream, line_count_max=100)
    logger = _logger(handler, "test.stalled")
    done = threading.Event()

    def log_a_burst() -> None:
        for index in range(LINE_COUNT):
            logger.warning("storage call %d failed: %s", index, "x" * 200)
        done.set()

    threading.Thread(target=log_a_burst, daemon=True).start()
    try:
        assert done.wait(BLOCKED_S), "logging blocked on a pipe nobody reads"
        assert handler.dropped_count > 0
    finally:
        os.close(read_end)  # the writer thread's next write fails; it carries on


def test_lines_arrive_whole_and_in_order_and_critical_at_once() -> None:
    stream = io.StringIO()
    handler = BackgroundStreamHandler(stream)
    logger = _logger(handler, "test.ordered")
    for index in range(100):
        logger.info("line %d", index)
    handler.flush()
    logger.critical("the last words")  # written in the caller, before this returns
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["msg"] for line in lines] == [f"line {index}" for index in range(100)] + ["the last words"]
    assert all(line["node"] == "n0" for line in lines) and handler.dropped_count == 0


class _SlowStream(io.StringIO):
    """A stream that takes a moment per line, as a busy log reader does."""

    def write(self, text: str) -> int:
        threading.Event().wait(0.001)
        return super().write(text)


def test_last_words_come_after_the_lines_that_explain_them() -> None:
    """Found by review: a CRITICAL line is written at once and the runtime exits right after
    (os._exit, no atexit), so lines still queued were lost, and the last words came first."""
    stream = _SlowStream()
    handler = BackgroundStreamHandler(stream)
    logger = _logger(handler, "test.last_words")
    for index in range(200):
        logger.warning("before %d", index)
    logger.critical("FATAL: the reason")
    lines = [json.loads(line)["msg"] for line in stream.getvalue().splitlines()]
    assert lines == [f"before {index}" for index in range(200)] + ["FATAL: the reason"]


def test_a_line_marked_write_at_once_is_written_before_the_call_returns() -> None:
    """The ownership serve and stop lines (cornus.runtime.ownership) are what the chaos harness
    checks single ownership from: one still queued when the node was killed -9 was lost, and the
    partition looked served until the kill, past the next owner's start."""
    stream = _SlowStream()
    handler = BackgroundStreamHandler(stream)
    logger = _logger(handler, "test.at_once")
    for index in range(200):
        logger.info("queued %d", index)
    logger.info("ownership stop partition=p0", extra={"write_at_once": True})
    written = [json.loads(line)["msg"] for line in stream.getvalue().splitlines()]
    assert "ownership stop partition=p0" in written, f"not written yet; {len(written)} lines were"
    handler.flush()
    lines = [json.loads(line)["msg"] for line in stream.getvalue().splitlines()]
    assert sorted(lines) == sorted([f"queued {index}" for index in range(200)] + ["ownership stop partition=p0"])


def test_the_azure_sdk_s_per_request_lines_stay_out_at_info() -> None:
    """Found by the chaos tool's Azure runs (2026-11-28): the SDK's INFO line for every request and
    answer was 87% of a node's log. It stays at WARNING, as the other chatty libraries do."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    stream = io.StringIO()
    try:
        configure_json_logging("n0", "INFO", stream)
        logging.getLogger("azure.core.pipeline.policies.http_logging_policy").info("Request URL: ...")
        logging.getLogger("azure.storage.blob").warning("a warning still shows")
        logging.getLogger("cornus.node").info("ours still shows")
        root.handlers[0].flush()
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
            handler.close()
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
    messages = [json.loads(line)["msg"] for line in stream.getvalue().splitlines()]
    assert messages == ["a warning still shows", "ours still shows"], messages
