"""What the Redis store checks of its server at open, before it answers any call: that the server
keeps what it acknowledged (storage_adapters/redis_store.py runs it). A vote or decision Redis
acknowledged and then lost, by eviction, a restart or a failover, loses a transaction's outcome,
so a server that may lose one is refused, naming the setting and the way out, and a server that
will not say (a least-privilege ACL, a managed service, a proxy) starts with a warning naming
what went unchecked."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

from storage_adapters.errors import StorageError, StorageUnavailable

log = logging.getLogger("cornus.storage.redis")

def _as_text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class ServerCheck:
    """The checks of one server: `where` names it in messages (no credentials); `bounded` runs a
    call within the store's deadline (LogStore._bounded); `replica_count` is N of "replicas:N"."""

    def __init__(self, client: aioredis.Redis, bounded: Callable[[Awaitable[Any], str], Awaitable[Any]],
                 where: str, replica_count: int) -> None:
        self._client = client
        self._bounded = bounded
        self.where = where
        self.replica_count = replica_count

    async def _refuse_eviction(self) -> None:
        """Refuse a Redis that may evict keys: under memory pressure an `allkeys-*` policy drops
        votes, and a `volatile-*` one drops decision tombstones first (the only keys given a TTL),
        so the status call would say "not known" of a committed transaction (found by review; the
        managed Redis services default to volatile-lru). No limit (maxmemory 0) evicts nothing."""
        memory = await self._info("memory", "that maxmemory-policy is noeviction, which Cornus "
                                  "needs (an evicted vote or tombstone loses a transaction's outcome)")
        if memory is None:
            return
        policy, limit = str(memory.get("maxmemory_policy", "")), int(memory.get("maxmemory", 0))
        if limit and policy != "noeviction":
            raise StorageError(
                f"redis at {self.where} has maxmemory {limit} and maxmemory-policy is {policy}: it may evict "
                "keys, and an evicted vote or decision tombstone loses a transaction's outcome. Set "
                "maxmemory-policy noeviction (a full Redis then refuses writes, which Cornus retries)"
            )

    async def _info(self, section: str, unchecked: str) -> dict[str, Any] | None:
        """INFO `section`, or None where the server will not answer it, with a warning naming what
        goes unchecked: a least-privilege ACL denies INFO (it is in @dangerous), and a proxy that
        forwards only data commands does not know it (found by review: that failed the open with
        a raw "unknown command")."""
        try:
            return await self._bounded(self._client.info(section), "INFO")
        except redis.exceptions.ResponseError as error:  # NoPermissionError among them
            log.warning("redis at %s does not answer INFO (%s): cannot check %s", self.where, error, unchecked)
            return None

    async def refuse_unsafe(self, durability: str) -> None:
        """Refuse a server that may lose what it acknowledged: one that may evict keys, whatever the
        durability; and, by `durability` ("aof", "replicas" or "none"), one that answers a write
        before it is on disk (found by review: nothing checked it, and Redis's own default is no
        append-only file at all, and `no-appendfsync-on-rewrite yes` skips fsync during rewrites),
        or that has fewer replicas in sync than asked. INFO says whether the append-only file is
        on; its fsync settings only CONFIG GET tells, which managed services deny: then the part
        that goes unchecked is said in the log. A server that loses its data later (restarted
        empty) is no setting: the store checks its mark on every new connection (redis_store)."""
        await self._refuse_eviction()
        where = self.where
        if durability == "none":
            log.warning("redis at %s: redis_durability none, nothing checked: a write Redis acknowledged may be "
                        "lost on its restart or failover, and with it a transaction's outcome", where)
            return
        if durability == "replicas":
            await self._refuse_too_few_replicas()
            return
        assert durability == "aof", durability
        way_out = ("or set redis_durability none (CORNUS_STORAGE_REDIS_DURABILITY) if its durability comes from "
                   "elsewhere and you answer for it")
        persistence = await self._info("persistence", "that it writes an append-only file before it answers, "
                                       "which Cornus needs")
        if persistence is None:
            return
        if int(persistence.get("aof_enabled", 0)) != 1:
            raise StorageError(
                f"redis at {where}: appendonly is no: it answers writes it may lose on a restart, and a lost vote "
                f"or decision loses a transaction's outcome. Run it with appendonly yes and appendfsync always, "
                f"{way_out}"
            )
        try:
            fsync = await self._bounded(self._client.config_get("appendfsync"), "CONFIG GET")
        except redis.exceptions.ResponseError:  # NoPermissionError among them; managed services deny CONFIG
            log.warning("redis at %s denies CONFIG GET: cannot check that appendfsync is always, which Cornus "
                        "needs (everysec loses up to a second of acknowledged writes on a crash)", where)
            return
        # Keys and values as bytes or str, by redis-py version: compared as text.
        texts = {_as_text(key): _as_text(value) for key, value in fsync.items()}
        policy = texts.get("appendfsync")
        if policy is None:  # a proxy or service that answers nothing for settings it does not expose
            log.warning("redis at %s does not say its appendfsync: cannot check that it is always, which Cornus "
                        "needs", where)
            return
        if policy != "always":
            raise StorageError(
                f"redis at {where}: appendfsync is {policy}: it answers writes before they are on disk, and loses "
                f"them on a crash (a lost vote or decision loses a transaction's outcome). Set appendfsync always, "
                f"{way_out}"
            )
        await self._refuse_no_fsync_on_rewrite(way_out)

    async def _refuse_no_fsync_on_rewrite(self, way_out: str) -> None:
        """Refuse `no-appendfsync-on-rewrite yes`: while a rewrite of the append-only file (or a
        snapshot) runs in the background, Redis then fsyncs nothing, even with appendfsync always,
        and answers writes a crash loses (found by audit, 2026-11-28, second: nothing checked it).
        Its own CONFIG GET: a pattern for both settings would do in one, but a proxy that answers
        only the names it exposes would answer it with nothing."""
        where = self.where
        try:
            reply = await self._bounded(self._client.config_get("no-appendfsync-on-rewrite"), "CONFIG GET")
        except redis.exceptions.ResponseError:  # read appendfsync, denied this: an ACL naming settings
            log.warning("redis at %s denies CONFIG GET no-appendfsync-on-rewrite: cannot check that it is no, "
                        "which Cornus needs (yes skips fsync while the append-only file is rewritten)", where)
            return
        texts = {_as_text(key): _as_text(value) for key, value in reply.items()}
        skips = texts.get("no-appendfsync-on-rewrite")
        if skips is None:
            log.warning("redis at %s does not say its no-appendfsync-on-rewrite: cannot check that it is no, which "
                        "Cornus needs", where)
            return
        if skips != "no":
            raise StorageError(
                f"redis at {where}: no-appendfsync-on-rewrite is {skips}: while it rewrites its append-only file "
                f"(or saves a snapshot) it answers writes before they are on disk, even with appendfsync always, and "
                f"loses them on a crash (a lost vote or decision loses a transaction's outcome). Set "
                f"no-appendfsync-on-rewrite no, {way_out}"
            )

    async def _refuse_too_few_replicas(self) -> None:
        """Durability "replicas:N": the server must be a primary with at least N replicas in sync,
        or every write would fail. Unavailable, not a configuration error: a replica restarting, or
        a failover moving the primary's address, passes, and the node's start waits for it."""
        wanted, where = self.replica_count, self.where
        replication = await self._info("replication", f"that it is a primary with {wanted} replicas; each "
                                       "write still waits for them")
        if replication is None:
            return
        role = str(replication.get("role", ""))
        if role != "master":
            raise StorageUnavailable(f"redis at {where} is not a primary (role {role}): its writes are refused")
        # Only replicas in sync count: connected_slaves also counts one still waiting for its first
        # copy, which acknowledges nothing (found by review). redis-py parses each slaveN line.
        online = sum(1 for name, replica in replication.items()
                     if name.startswith("slave") and isinstance(replica, dict) and replica.get("state") == "online")
        if online < wanted:
            connected = int(replication.get("connected_slaves", 0))
            raise StorageUnavailable(
                f"redis at {where} has {online} replica(s) in sync ({connected} connected), and redis_durability "
                f"replicas:{wanted} answers a write only once {wanted} have it"
            )
