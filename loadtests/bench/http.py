"""The load generator of `cornus bench`: concurrent clients on one asyncio loop, each holding one
keep-alive HTTP/1.1 connection to a node and posting one-shot transactions to `/v1/execute`.

Why not httpx: a request through httpx costs a few hundred microseconds of CPU, so at the rates we
measure the generator would take a core away from the nodes it measures. The exchange here is the
smallest correct HTTP/1.1 client for a server we know (uvicorn: every response has a
Content-Length): tens of microseconds per transaction. Every request has a deadline and every
retry loop a bound.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cornus.runtime.keys import partition_of

# Deadline of one HTTP exchange; a node that does not answer within it is counted as failing.
TIMEOUT_S_REQUEST = 15.0
# Response heads are a few hundred bytes; a larger one is not uvicorn talking to us.
RESPONSE_HEAD_BYTES_MAX = 16 * 1024
RESPONSE_BODY_BYTES_MAX = 16 * 1024 * 1024
# Keys per partition the generator picks from: enough that concurrent clients rarely collide.
KEYS_PER_PARTITION = 2_000
VALUE_BYTES = 100
# The load phase writes this many keys per transaction (one partition each: no commit protocol
# round, so loading is quick), and tries an aborted batch again at most this often.
LOAD_OPS_PER_TXN = 200
LOAD_ATTEMPT_COUNT_MAX = 5
LOAD_CONCURRENCY = 8
FAILURE_PAUSE_S = 0.01


class BenchHttpError(Exception):
    """The node answered something that is not an HTTP/1.1 response we can read."""


class HttpConnection:
    """One keep-alive connection; one request at a time."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._prefix = f"POST {{path}} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """(status, body) of one POST, within TIMEOUT_S_REQUEST. A broken connection is reopened
        on the next call."""
        try:
            async with asyncio.timeout(TIMEOUT_S_REQUEST):
                return await self._exchange(path, body)
        except BaseException:
            self.close()
            raise

    async def _exchange(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        head = self._prefix.format(path=path) + f"Content-Length: {len(body)}\r\n\r\n"
        self._writer.write(head.encode("ascii") + body)
        try:
            response_head = await self._reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError as error:
            raise BenchHttpError("response head too long") from error
        if len(response_head) > RESPONSE_HEAD_BYTES_MAX:
            raise BenchHttpError("response head too long")
        lines = response_head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise BenchHttpError(f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
        length = -1
        close = False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value.strip())
            elif name == "connection" and value.strip().lower() == "close":
                close = True
        if not 0 <= length <= RESPONSE_BODY_BYTES_MAX:
            raise BenchHttpError(f"response without a usable Content-Length ({length})")
        data = await self._reader.readexactly(length)
        if close:
            self.close()
        return int(parts[1]), data

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


def keys_by_partition(partition_count: int) -> dict[str, list[str]]:
    """A pool of keys per partition, so a transaction can aim at the partitions it wants."""
    pools: dict[str, list[str]] = {f"p{i}": [] for i in range(partition_count)}
    index = 0
    while min(len(pool) for pool in pools.values()) < KEYS_PER_PARTITION:
        key = f"k{index}"
        pools[partition_of(key, partition_count)].append(key)
        index += 1
    return pools


def transaction(rng: random.Random, pools: dict[str, list[str]], partitions_per_txn: int,
                ops_per_txn: int) -> list[dict[str, str]]:
    """Ops spread round-robin over the chosen partitions; each partition's first op is a put, so
    every touched partition is a participant (a distributed commit), then gets and puts alternate."""
    partitions = rng.sample(sorted(pools), partitions_per_txn)
    ops: list[dict[str, str]] = []
    for index in range(max(ops_per_txn, partitions_per_txn)):
        key = rng.choice(pools[partitions[index % partitions_per_txn]])
        if (index // partitions_per_txn) % 2 == 0:
            ops.append({"op": "put", "key": key, "value": "x" * VALUE_BYTES})
        else:
            ops.append({"op": "get", "key": key})
    return ops


@dataclass
class LoadResult:
    committed: int = 0
    aborted: int = 0
    other: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0


def _outcome(status: int, data: bytes) -> str | None:
    if status not in (200, 202, 409, 503):
        return None
    try:
        return json.loads(data).get("outcome")
    except ValueError:
        return None


async def load_keys(addresses: Sequence[tuple[str, int]], pools: dict[str, list[str]]) -> int:
    """Write every key of the pools once (the YCSB load phase), so the measured run reads what its
    owners hold in memory, as the paper's nodes do. Returns how many keys were written."""
    batches = [pool[start:start + LOAD_OPS_PER_TXN] for pool in pools.values()
               for start in range(0, len(pool), LOAD_OPS_PER_TXN)]
    queue: asyncio.Queue[list[str]] = asyncio.Queue()
    for batch in batches:
        queue.put_nowait(batch)
    value = "x" * VALUE_BYTES

    async def loader(index: int) -> int:
        host, port = addresses[index % len(addresses)]
        connection = HttpConnection(host, port)
        written = 0
        try:
            while not queue.empty():
                batch = queue.get_nowait()
                body = json.dumps({"ops": [{"op": "put", "key": key, "value": value} for key in batch]}).encode()
                for _attempt in range(LOAD_ATTEMPT_COUNT_MAX):
                    status, data = await connection.post("/v1/execute", body)
                    if _outcome(status, data) == "committed":
                        written += len(batch)
                        break
                else:
                    raise RuntimeError(f"load phase: a batch of {len(batch)} keys did not commit in "
                                       f"{LOAD_ATTEMPT_COUNT_MAX} attempts (last answer {status})")
        finally:
            connection.close()
        return written

    counts = await asyncio.gather(*(loader(i) for i in range(LOAD_CONCURRENCY)))
    return sum(counts)


async def run_clients(addresses: Sequence[tuple[str, int]], pools: dict[str, list[str]], *, seconds: float,
                      clients: int, partitions_per_txn: int, ops_per_txn: int,
                      home: Mapping[str, int] | None = None) -> LoadResult:
    """`clients` closed-loop clients for `seconds`. Each transaction goes to the node that holds its
    first partition (`home`: partition -> index in `addresses`), as the paper's clients send each
    transaction to its home node, which then coordinates it and is one of its participants; without
    `home`, or for a partition it does not name, to a node picked at random."""
    partition_count = len(pools)
    result = LoadResult()
    stop_at = time.monotonic() + seconds

    async def client(index: int) -> None:
        rng = random.Random(index)
        connections = [HttpConnection(host, port) for host, port in addresses]
        try:
            while time.monotonic() < stop_at:
                ops = transaction(rng, pools, partitions_per_txn, ops_per_txn)
                target = home.get(partition_of(ops[0]["key"], partition_count)) if home else None
                connection = connections[rng.randrange(len(connections)) if target is None else target]
                body = json.dumps({"ops": ops}).encode()
                started = time.perf_counter()
                try:
                    status, data = await connection.post("/v1/execute", body)
                except (OSError, TimeoutError, BenchHttpError, asyncio.IncompleteReadError):
                    result.other += 1
                    # A node that refuses connections must not turn this client into a busy loop.
                    await asyncio.sleep(FAILURE_PAUSE_S)
                    continue
                elapsed_ms = (time.perf_counter() - started) * 1000
                outcome = _outcome(status, data)
                if outcome == "committed":
                    result.committed += 1
                    result.latencies_ms.append(elapsed_ms)
                elif outcome == "aborted":
                    result.aborted += 1
                else:
                    result.other += 1
        finally:
            for connection in connections:
                connection.close()

    started = time.monotonic()
    await asyncio.gather(*(client(i) for i in range(clients)))
    result.wall_s = time.monotonic() - started
    return result
