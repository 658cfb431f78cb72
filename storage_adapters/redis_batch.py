"""Group commit for Redis: while a store already has IN_FLIGHT_COUNT_MAX round trips under way,
further Lua script calls queue, and the next free round trip carries all of them as ONE pipeline
(one write, one read); each caller gets its own reply or its own error, exactly as if it had
called alone. A quiet store sends each call at once, alone: batching costs nothing until load
makes it pay.

Why it is safe: every script is atomic on its own (a compare-and-swap for `log_once`), so a
pipeline without MULTI changes nothing about what each one does; it only saves the round trips and
the socket writes, which under load cost the node more CPU than the scripts. An operation is sent
at most once by the pipeline: only a NOSCRIPT reply (Redis lost its script cache, e.g. after a
restart: the script did not run) is sent again, after the script is loaded.

Why not redis-py's `Script` objects inside the pipeline: redis-py then asks SCRIPT EXISTS before
every pipeline, a second round trip each time.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

# Operations in one pipeline: bounds the request one pipeline writes and the replies it awaits.
BATCH_COUNT_MAX = 128
# Round trips in flight at once. Below it a call goes out at once, alone (no added latency, no
# added cost when the store is quiet); at it, calls queue and the next round trip to free up
# carries all of them in one pipeline (group commit: batches grow with the load).
IN_FLIGHT_COUNT_MAX = 1


@dataclass(slots=True)
class _Operation:
    script: AsyncScript
    keys: list[str]
    args: list[Any]
    future: asyncio.Future[Any]


class ScriptBatcher:
    """Runs script calls, alone while few are in flight and coalesced into pipelines beyond that.
    The caller bounds its own wait (a caller that gives up leaves a queued operation to run, as a
    timed-out call would); each pipeline is bounded by `timeout_ms` too, so nothing waits on a
    silent Redis forever."""

    def __init__(self, client: aioredis.Redis, timeout_ms: int, *, batch_count_max: int = BATCH_COUNT_MAX,
                 in_flight_count_max: int = IN_FLIGHT_COUNT_MAX) -> None:
        assert timeout_ms > 0 and batch_count_max > 0 and in_flight_count_max > 0
        self._client = client
        self._timeout_s = timeout_ms / 1000
        self._batch_count_max = batch_count_max
        self._in_flight_count_max = in_flight_count_max
        self._in_flight_count = 0
        self._pending: list[_Operation] = []
        self._sending: set[asyncio.Task[None]] = set()
        self.round_trip_count = 0  # single calls and pipelines sent
        self.operation_count = 0

    async def run(self, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        self.operation_count += 1
        if self._in_flight_count < self._in_flight_count_max and not self._pending:
            self._in_flight_count += 1
            self.round_trip_count += 1
            try:
                # redis-py's own script call: it reloads the script on NOSCRIPT.
                return await script(keys=keys, args=args)
            finally:
                self._in_flight_count -= 1
                self._send_pending()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append(_Operation(script, keys, args, future))
        return await future

    def _send_pending(self) -> None:
        while self._pending and self._in_flight_count < self._in_flight_count_max:
            batch = self._pending[:self._batch_count_max]
            del self._pending[:self._batch_count_max]
            batch = [operation for operation in batch if not operation.future.done()]  # callers gone
            if not batch:
                continue
            self._in_flight_count += 1
            self.round_trip_count += 1
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[_Operation]) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                replies = await self._pipeline(batch)
        except BaseException as error:  # the whole round trip failed: every caller hears it
            for operation in batch:
                if not operation.future.done():
                    operation.future.set_exception(error)
            if isinstance(error, asyncio.CancelledError):
                raise
            return
        finally:
            self._in_flight_count -= 1
            self._send_pending()
        assert len(replies) == len(batch)
        for operation, reply in zip(batch, replies, strict=True):
            if operation.future.done():
                continue  # its caller gave up
            if isinstance(reply, Exception):
                operation.future.set_exception(reply)
            else:
                operation.future.set_result(reply)

    async def _pipeline(self, batch: list[_Operation]) -> list[Any]:
        replies = await self._execute(batch)
        missing = [index for index, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            # The script did not run for these: load it and send just them again.
            for script in {id(batch[index].script): batch[index].script for index in missing}.values():
                script.sha = await self._client.script_load(script.script)
            again = await self._execute([batch[index] for index in missing])
            for index, reply in zip(missing, again, strict=True):
                replies[index] = reply
        return replies

    async def _execute(self, batch: list[_Operation]) -> list[Any]:
        pipeline = self._client.pipeline(transaction=False)
        for operation in batch:
            pipeline.evalsha(operation.script.sha, len(operation.keys), *operation.keys, *operation.args)
        return await pipeline.execute(raise_on_error=False)

    async def close(self) -> None:
        for task in list(self._sending):
            task.cancel()
        await asyncio.gather(*self._sending, return_exceptions=True)
