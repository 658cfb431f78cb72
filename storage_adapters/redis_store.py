"""Redis backend: every contract call is ONE Lua script run by EVALSHA (redis-py's Script object
falls back to EVAL on NOSCRIPT, e.g. after a restart flushed the script cache).

Key layout. A record is a hash at `cxtxn:{<log>}:<txn>`; each log keeps a sorted set of its
unfinished txn ids at `cxtxn:{<log>}:~unfinished` (the `~` cannot occur in a txn id, so the names
never collide) so recovery scans only what needs work. Every member has score 0, which orders the
set by the ids' bytes, so ZRANGE BYLEX resumes a scan strictly after any txn id (earlier versions
kept a plain set there, which these scripts meet with WRONGTYPE: convert it before upgrading, one
ZADD with score 0 per SMEMBERS member). Data lives at `cxdata:{p.<partition>}:<key>`. The braces
are a hash tag: a partition's records, index and data share one slot, so the scripts that touch
several of them run on Redis Cluster, and the `cxtxn:`/`cxdata:` prefixes let Redis ACLs give
transaction state and data different permissions (paper section 4.1).

Durability is the server's job: run it with `appendfsync always` (or WAITAOF/WAIT to replicas), or
a failover may lose an acknowledged VOTE_YES.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from storage_adapters.contract import (
    SCAN_PAGE_COUNT_MAX,
    SCAN_ROUND_COUNT_MAX,
    LogId,
    LogOnceResult,
    LogStore,
    Record,
    RecordBody,
    TxnState,
    is_unfinished,
    validate_body,
    validate_data_keys,
    validate_log,
    validate_partition,
    validate_scan_after,
    validate_scan_limit,
    validate_state,
    validate_txn,
    validate_writes,
)
from storage_adapters.errors import DecisionFlipRefused, InvariantViolation, StorageUnavailable

TIMEOUT_MS_CALL_DEFAULT = 5_000
CONNECTION_COUNT_MAX = 64
TXN_PREFIX = "cxtxn"
DATA_PREFIX = "cxdata"
_UNFINISHED = "~unfinished"

# A record is unfinished while it is VOTE_YES, or COMMIT with its redo not applied yet. Every
# script keeps the index in step with that rule in the same atomic step as the state change. The
# score is always 0: with equal scores a sorted set orders its members bytewise, which BYLEX needs.
_SYNC_INDEX = """
local function sync_index(record_key, index_key, txn)
  local state = redis.call('HGET', record_key, 'state')
  local applied = redis.call('HGET', record_key, 'applied')
  if state == 'VOTE_YES' or (state == 'COMMIT' and applied == '0') then
    redis.call('ZADD', index_key, 0, txn)
  else
    redis.call('ZREM', index_key, txn)
  end
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

# KEYS: record, index. ARGV: txn, state, participants(json), coordinator, redo.
_LOG_ONCE = _SYNC_INDEX + """
local stored = redis.call('HGET', KEYS[1], 'state')
if stored then return {stored, 0} end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'participants', ARGV[3], 'coordinator', ARGV[4],
           'redo', ARGV[5], 'applied', '0', 'created_at_ms', now_ms())
sync_index(KEYS[1], KEYS[2], ARGV[1])
return {ARGV[2], 1}
"""

# KEYS: record, index. ARGV: txn, state, has_body('1'|'0'), participants, coordinator, redo.
_LOG = _SYNC_INDEX + """
local stored = redis.call('HGET', KEYS[1], 'state')
if stored and stored ~= 'VOTE_YES' and stored ~= ARGV[2] then return {'REFUSED', stored} end
if not stored then
  redis.call('HSET', KEYS[1], 'participants', '[]', 'coordinator', '', 'redo', '', 'applied', '0',
             'created_at_ms', now_ms())
end
if ARGV[3] == '1' then
  redis.call('HSET', KEYS[1], 'participants', ARGV[4], 'coordinator', ARGV[5], 'redo', ARGV[6])
end
redis.call('HSET', KEYS[1], 'state', ARGV[2])
sync_index(KEYS[1], KEYS[2], ARGV[1])
return {'OK', ARGV[2]}
"""

# KEYS: record, index, data keys... ARGV: txn, then per data key an op ('s'|'d') and a value.
_APPLY_REDO = _SYNC_INDEX + """
local stored = redis.call('HGET', KEYS[1], 'state')
if stored ~= 'COMMIT' then return {'NOT_COMMIT', stored or 'absent'} end
if redis.call('HGET', KEYS[1], 'applied') == '1' then return {'APPLIED_BEFORE', 'COMMIT'} end
for i = 3, #KEYS do
  local op = ARGV[2 * (i - 2)]
  if op == 's' then
    redis.call('SET', KEYS[i], ARGV[2 * (i - 2) + 1])
  else
    redis.call('DEL', KEYS[i])
  end
end
redis.call('HSET', KEYS[1], 'applied', '1')
sync_index(KEYS[1], KEYS[2], ARGV[1])
return {'OK', 'COMMIT'}
"""

# KEYS: record, index. ARGV: txn.
_DELETE = """
redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('DEL', KEYS[1])
"""

T = TypeVar("T")


def _tag(log: LogId) -> str:
    return "{" + log.key + "}"


def _record_key(log: LogId, txn: str) -> str:
    return f"{TXN_PREFIX}:{_tag(log)}:{txn}"


def _index_key(log: LogId) -> str:
    return f"{TXN_PREFIX}:{_tag(log)}:{_UNFINISHED}"


def _data_key(partition: str, key: str) -> str:
    return f"{DATA_PREFIX}:{_tag(LogId.partition(partition))}:{key}"


def _record_from_hash(log: LogId, txn: str, fields: dict[bytes, bytes]) -> Record:
    return Record(
        log=log,
        txn=txn,
        state=TxnState(fields[b"state"].decode()),
        body=RecordBody(
            tuple(json.loads(fields[b"participants"])), fields[b"coordinator"].decode(), fields[b"redo"]
        ),
        applied=fields[b"applied"] == b"1",
        created_at_ms=int(fields[b"created_at_ms"]),
    )


class RedisStore(LogStore):
    """LogStore over Redis. Open with `await RedisStore.open("redis://127.0.0.1:6379/0")`."""

    backend_name = "redis"

    def __init__(self, client: aioredis.Redis, timeout_ms_call: int) -> None:
        assert timeout_ms_call > 0
        self.timeout_ms_call = timeout_ms_call
        self._client = client
        self._log_once = client.register_script(_LOG_ONCE)
        self._log = client.register_script(_LOG)
        self._apply_redo = client.register_script(_APPLY_REDO)
        self._delete = client.register_script(_DELETE)

    @classmethod
    async def open(cls, url: str, *, timeout_ms_call: int = TIMEOUT_MS_CALL_DEFAULT) -> RedisStore:
        timeout_s = timeout_ms_call / 1000
        client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            # The caller owns retries (it knows whether the call is idempotent at its level); a
            # hidden client retry would also stretch a call past its deadline.
            retry=Retry(NoBackoff(), 0),
            max_connections=CONNECTION_COUNT_MAX,
            decode_responses=False,
        )
        store = cls(client, timeout_ms_call)
        await store._bounded(client.ping(), "PING")
        return store

    async def _bounded(self, call: Awaitable[T], what: str) -> T:
        try:
            async with asyncio.timeout(self.timeout_ms_call / 1000):
                return await call
        except TimeoutError:
            raise StorageUnavailable(f"redis {what} did not answer within {self.timeout_ms_call} ms") from None
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as error:
            raise StorageUnavailable(f"redis {what}: {error}") from error
        except redis.exceptions.BusyLoadingError as error:
            raise StorageUnavailable(f"redis {what}: server is loading its data") from error

    async def log_once(self, log: LogId, txn: str, state: TxnState, body: RecordBody) -> LogOnceResult:
        validate_log(log)
        validate_txn(txn)
        validate_state(state)
        validate_body(body)
        reply = await self._bounded(
            self._log_once(
                keys=[_record_key(log, txn), _index_key(log)],
                args=[txn, state.value, json.dumps(body.participants), body.coordinator, body.redo],
            ),
            "log_once",
        )
        stored, created = TxnState(reply[0].decode()), reply[1] == 1
        assert stored is state or not created, "a created record holds what we wrote"
        return LogOnceResult(stored, created)

    async def log(self, log: LogId, txn: str, state: TxnState, body: RecordBody | None = None) -> TxnState:
        validate_log(log)
        validate_txn(txn)
        validate_state(state)
        if body is not None:
            validate_body(body)
        body_args: list[Any] = (
            ["0", "", "", b""]
            if body is None
            else ["1", json.dumps(body.participants), body.coordinator, body.redo]
        )
        verdict, stored = await self._bounded(
            self._log(keys=[_record_key(log, txn), _index_key(log)], args=[txn, state.value, *body_args]),
            "log",
        )
        if verdict == b"REFUSED":
            raise DecisionFlipRefused(log, txn, TxnState(stored.decode()), state)
        assert verdict == b"OK" and stored.decode() == state.value
        return state

    async def read(self, log: LogId, txn: str) -> Record | None:
        validate_log(log)
        validate_txn(txn)
        fields = await self._bounded(self._client.hgetall(_record_key(log, txn)), "read")
        return _record_from_hash(log, txn, fields) if fields else None

    async def scan_unfinished(self, log: LogId, limit: int = SCAN_PAGE_COUNT_MAX, after: str = "") -> list[Record]:
        validate_log(log)
        validate_scan_limit(limit)
        validate_scan_after(after)
        index_key = _index_key(log)

        async def scan() -> list[Record]:
            records: list[Record] = []
            start = after
            for _ in range(SCAN_ROUND_COUNT_MAX):
                wanted = limit - len(records)
                # "(" makes the bound exclusive; "-" is the smallest member.
                members = await self._client.zrange(
                    index_key, f"({start}" if start else "-", "+", bylex=True, offset=0, num=wanted
                )
                txns = [member.decode() for member in members]
                assert txns == sorted(txns) and all(txn > start for txn in txns)
                pipe = self._client.pipeline(transaction=False)
                for txn in txns:
                    pipe.hgetall(_record_key(log, txn))
                rows = await pipe.execute()
                # A record finished or deleted between the two round trips left the index after we
                # read it: it needs no work, so it is dropped and the page refilled beyond it.
                for txn, fields in zip(txns, rows, strict=True):
                    record = _record_from_hash(log, txn, fields) if fields else None
                    if record is not None and is_unfinished(record.state, record.applied):
                        records.append(record)
                if len(txns) < wanted or len(records) == limit:
                    return records
                start = txns[-1]
            raise StorageUnavailable(
                f"redis scan of {log.key}: records kept finishing under it for {SCAN_ROUND_COUNT_MAX} rounds"
            )

        return await self._bounded(scan(), "scan_unfinished")

    async def read_data(self, partition: str, keys: Sequence[str]) -> dict[str, bytes | None]:
        validate_partition(partition)
        checked = validate_data_keys(keys)
        if not checked:
            return {}
        values = await self._bounded(
            self._client.mget([_data_key(partition, key) for key in checked]), "read_data"
        )
        return dict(zip(checked, values, strict=True))

    async def apply_redo(self, partition: str, txn: str, writes: Mapping[str, bytes | None]) -> bool:
        validate_partition(partition)
        validate_txn(txn)
        checked = validate_writes(writes)
        log = LogId.partition(partition)
        keys = [_record_key(log, txn), _index_key(log)]
        args: list[Any] = [txn]
        for key, value in checked.items():
            keys.append(_data_key(partition, key))
            args.extend(["d", b""] if value is None else ["s", value])
        verdict, stored = await self._bounded(self._apply_redo(keys=keys, args=args), "apply_redo")
        if verdict == b"NOT_COMMIT":
            raise InvariantViolation(
                f"apply_redo of txn {txn!r} on {partition!r}: record is {stored.decode()}, not COMMIT"
            )
        assert verdict in (b"OK", b"APPLIED_BEFORE")
        return verdict == b"OK"

    async def delete(self, log: LogId, txn: str) -> bool:
        validate_log(log)
        validate_txn(txn)
        removed = await self._bounded(
            self._delete(keys=[_record_key(log, txn), _index_key(log)], args=[txn]), "delete"
        )
        return removed == 1

    async def close(self) -> None:
        await self._client.aclose()
