"""Redis backend: every contract call is ONE Lua script run by EVALSHA (redis-py's Script object
falls back to EVAL on NOSCRIPT, e.g. after a restart flushed the script cache). Deletes go further:
the contract's base hands over those of one event-loop tick together, and one script deletes all
of one log's (at most DELETE_BATCH_COUNT_MAX), each record under its own fence check.

Key layout. A record is a hash at `cxtxn:{<log>}:<txn>`; each log keeps a sorted set of its
unfinished txn ids at `cxtxn:{<log>}:~unfinished` (the `~` cannot occur in a txn id, so the names
never collide) so recovery scans only what needs work. Every member has score 0, which orders the
set by the ids' bytes, so ZRANGE BYLEX resumes a scan strictly after any txn id (earlier versions
kept a plain set there, which these scripts meet with WRONGTYPE: convert it before upgrading, one
ZADD with score 0 per SMEMBERS member). Data lives at `cxdata:{p.<partition>}:<key>`. The braces
are a hash tag: a partition's records, index and data share one slot, so the scripts that touch
several of them run on Redis Cluster, and the `cxtxn:`/`cxdata:` prefixes let Redis ACLs give
transaction state and data different permissions (paper section 4.1). A partition's ownership
record is a hash at `cxown:{p.<partition>}`, in the same slot, so a fenced write's script checks
it and writes in one atomic step; a node's identity record is at `cxown:{c.<node>}`, in the slot of
its coordinator log, which its fence guards.

The finished index. Beside `~unfinished`, each log keeps `cxtxn:{<log>}:~finished`, a sorted set
(score 0, as above) of its finished records that are not tombstones (an ABORT, or a COMMIT applied:
in a coordinator's log only its ABORTs, its COMMIT never being applied), which
`scan_finished_page` reads so that a collector of what a crash left behind walks only those
(docs/sweeper-design.md). Every script that changes a record's state keeps it in step in the same
atomic step (`_SYNC_INDEX`), yet it is a hint: the scan reads each record again and returns it only
if it is still finished and has no expiry, and removes members whose record is gone or is no longer
so (`_PRUNE_FINISHED`: a record deleted by a script of an earlier version, which knew no such
index, during a rollout). During a rollout the scripts of the earlier version neither add nor
remove members: a record they finish is left out, and a member whose record they deleted or made a
tombstone is pruned by the next scan that meets it. The records finished before the index existed,
or by those scripts, are in no scan until the backfill adds them: `backfill_finished_index`
(`cornus storage-backfill-finished-index`), run once every node runs these scripts. It walks the
keyspace with SCAN MATCH `cxtxn:*` TYPE hash, a batch at a time, and runs `_BACKFILL_FINISHED`
per log on each batch (a script's keys share the log's slot), which reads each record again with
`_SYNC_INDEX`'s own rule and adds it only if it is finished and has no expiry. A node's script
changes a record either before that atomic step or after it, and then keeps the index in step
itself, so the backfill is safe beside running nodes; it only adds, so it is safe to run again.

The identity registry: Redis cannot list hash keys by a prefix without walking the whole keyspace
(SCAN), so the ids of the nodes that ever took an identity are also kept in one sorted set at
`cxown:{~identities}`, every score 0 (ordered by the ids' bytes, as the unfinished indexes are),
which `list_identities` reads a page of with one ZRANGE BYLEX. Its hash tag is its own slot: no
log key (`p.`/`c.` and a name) can be `~identities`, whose `~` is outside the id alphabet. A take
of an identity (a first record, or a new epoch) adds its node with a ZADD of its own before the
take's script runs: the registry is another slot than the identity record, so no one script can
do both on Redis Cluster, and added first, a node is listed before its take can succeed. Renewals
and releases (the same epoch) add nothing and cost no second round trip. Members are never
removed: nor are identity records.

Durability: a write is answered once the server has it on disk (durability "aof": `appendonly yes`
and `appendfsync always`, checked at open), or on N replicas ("replicas:N": every write is followed
by a WAIT on its connection, and a write fewer replicas had by WAIT's timeout fails as unavailable),
or as the server answers it ("none"). Replication is asynchronous, so WAIT is what makes a write
survive the primary: without it a failover loses what the primary acknowledged and had not sent
yet. A log_once that finds a record, and a read of a record (a status call's, a resolve's), are
answered only once the replicas have what they found: what was found may be another node's write
not yet replicated, on which this node acts without a write of its own (a Cornus coordinator's
termination that finds every vote yes replies COMMIT; found by audit, 2026-11-28: the found path
wrote nothing, so its WAIT covered nothing of it). Each script bumps a counter in the log's slot
(`cxtxn:{<log>}:~read`, read by nobody), which puts a write of this connection after everything
it saw in the replication stream, and the WAIT after it covers all of that; else a status call
could report an outcome (an ABORT) whose writer still waited for its replicas, which a failover
at that moment loses. Scans (recovery) and data
reads need no such wait: what recovery does with a record it found is a write, which comes later
in the stream, and a committed value a failover loses is applied again from its decision.

The store's mark. A server that lost its data answers every later write as if nothing had ever
been written: a Redis without persistence that its supervisor restarted (a replica then resyncs
to its empty primary, so durability "replicas:N" does not help), a FLUSHALL, a failover to a
replica that never had the data. A participant's LogOnce(ABORT) then fills the slot of a vote
whose transaction a client was told committed. So open gives the storage a mark, a random value
at `STORE_MARK_KEY` written only where there is none (the first store ever opened on it writes
it, every later one reads it), and keeps what it found; every new connection, the pipelined one
and each of redis-py's, reads the mark back in its set-up, before any call goes out on it. Gone,
or another value (a store opened on the emptied server since wrote its own), the server lost its
data: every call from then on fails with InvariantViolation, which stops the node instead of
retrying (StorageUnavailable would, for ever), and writes nothing (found by audit, 2026-11-28,
second: the open-time checks never saw it). A node started after the loss cannot tell emptied
storage from new storage; only persistence (or no restart of a primary without it) prevents the
loss, which the mark only stops the running nodes from building on.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript

from storage_adapters.contract import (
    IDENTITY_PREFIX,
    SCAN_ROUND_COUNT_MAX,
    Fence,
    LogId,
    LogKind,
    LogOnceResult,
    Ownership,
    OwnerWriteResult,
    PageBytes,
    Record,
    RecordBody,
    ScanPage,
    Tombstone,
    TxnState,
    check_tombstone,
    commit_tombstone_needs_applied,
    identity_name,
    is_identity,
    is_unfinished,
    validate_txn,
)
from storage_adapters.errors import (
    DecisionFlipRefused,
    Fenced,
    InvariantViolation,
    StorageError,
    StorageUnavailable,
    ValidationError,
)
from storage_adapters.redis_server_check import ServerCheck
from storage_adapters.resp_pipe import ConnectCheck, NotReplicated, RespAddress, RespPipe, not_serving
from storage_adapters.store import (
    DELETE_BATCH_COUNT_MAX,
    DeleteRequest,
    LogStore,
    boot_clock_s,
    call_deadline_if_set,
    whole_page,
)

TIMEOUT_MS_CALL_DEFAULT = 5_000
# redis-py's classes of the server states resp_pipe.SERVER_STATE_REPLIES names (LOADING is a
# ConnectionError there, handled with those).
_NOT_SERVING_ERRORS = (redis.exceptions.ReadOnlyError, redis.exceptions.OutOfMemoryError,
                       redis.exceptions.MasterDownError, redis.exceptions.TryAgainError)
# WAIT's timeout (durability "replicas:N"), as a share of the call's deadline: Redis holds a
# connection's later commands while its WAIT waits, so a call that queued behind one still has the
# rest of its deadline for its own write and WAIT; and a WAIT that ends first says why the call
# failed (too few replicas), where the caller's own timer would say only that it timed out.
REPLICA_WAIT_SHARE_OF_CALL = 0.5
CONNECTION_COUNT_MAX = 64
# Records a scan reads in one round trip: a page of large ones stops reading once it holds
# SCAN_PAGE_BYTES_MAX (contract), instead of having read them all.
SCAN_READ_CHUNK_COUNT = 64
# The backfill of the finished index (the module docstring). Keys one SCAN asks Redis to look at
# (its COUNT, a hint: a hash bucket's keys come back together, so a batch may hold a few more): the
# default, and the most, since one batch's records are re-checked by scripts that hold the server.
BACKFILL_SCAN_COUNT_DEFAULT = 1_000
BACKFILL_SCAN_COUNT_MAX = 10_000
# Record keys one run walks unless told otherwise (some minutes' work), and the most it may be told:
# a run stops at the first batch that reaches its bound, and says where the next one resumes.
BACKFILL_KEY_COUNT_DEFAULT = 1_000_000
BACKFILL_KEY_COUNT_MAX = 1_000_000_000
# SCANs one run makes at most: a keyspace mostly of data keys gives batches of few records or none,
# which the key bound does not stop; with COUNT 1,000 this is a billion keys looked at.
BACKFILL_SCAN_CALL_COUNT_MAX = 1_000_000
# Records one backfill script re-checks at most: Redis serves nothing else while a script runs.
BACKFILL_SCRIPT_KEY_COUNT_MAX = 256
# SCAN's cursor is an unsigned 64-bit integer.
SCAN_CURSOR_MAX = 2**64 - 1
log = logging.getLogger("cornus.storage.redis")

TXN_PREFIX = "cxtxn"
DATA_PREFIX = "cxdata"
OWNER_PREFIX = "cxown"
_UNFINISHED = "~unfinished"
# The finished index (the module docstring): `~` keeps it apart from every record, as above.
_FINISHED = "~finished"
# The counter a record's read bumps in durability "replicas:N" (the module docstring); `~` keeps it
# apart from every record.
_READ_MARK = "~read"
# The sorted set of the ids of every node that took an identity (see the module docstring).
IDENTITY_REGISTRY_KEY = f"{OWNER_PREFIX}:{{~identities}}"
# The store's mark (the module docstring): a slot of its own, whose `~` no log or node can name.
STORE_MARK_KEY = f"{OWNER_PREFIX}:{{~store}}"

# A record is unfinished while it is VOTE_YES, or COMMIT with its redo not applied yet; it is
# finished while it exists, is not unfinished (an ABORT, or a COMMIT applied) and has no expiry (a
# tombstone has one: it is already collected). Every script keeps both indexes in step with that
# rule in the same atomic step as the state change: `sync_index` reads the record as it now is,
# and a script that knows what it just wrote `place`s it without reading it back (log_once's new
# record, apply_redo's applied COMMIT, a delete), which keeps the hot path's calls as cheap as
# before the finished index came (one ZADD and one ZREM each, where the index alone cost two HGETs
# and one of those). PTTL only for a record that is finished, where the expiry decides. The score
# is always 0: with equal scores a sorted set orders its members bytewise, which BYLEX needs.
_SYNC_INDEX = """
local function unfinished(state, applied)
  return state == 'VOTE_YES' or (state == 'COMMIT' and applied == '0')
end
local function place(index_key, finished_key, txn, is_unfinished, is_finished)
  if is_unfinished then redis.call('ZADD', index_key, 0, txn) else redis.call('ZREM', index_key, txn) end
  if is_finished then redis.call('ZADD', finished_key, 0, txn) else redis.call('ZREM', finished_key, txn) end
end
local function belongs(record_key)
  local stored = redis.call('HMGET', record_key, 'state', 'applied')
  local open = unfinished(stored[1], stored[2])
  return open, (stored[1] and not open and redis.call('PTTL', record_key) == -1) or false
end
local function sync_index(record_key, index_key, finished_key, txn)
  local is_unfinished, is_finished = belongs(record_key)
  place(index_key, finished_key, txn, is_unfinished, is_finished)
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

# KEYS: record, index, finished index, and in durability "replicas:N" the log's read mark (found:
# bumped, so the WAIT after it covers the record it found, as a read's does). ARGV: txn, state,
# participants(json), coordinator, redo.
_LOG_ONCE = _SYNC_INDEX + """
local stored = redis.call('HGET', KEYS[1], 'state')
if stored then
  if KEYS[4] then redis.call('INCR', KEYS[4]) end
  return {stored, 0}
end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'participants', ARGV[3], 'coordinator', ARGV[4],
           'redo', ARGV[5], 'applied', '0', 'created_at_ms', now_ms())
-- A new key: no expiry, so finished exactly when not unfinished.
local open = unfinished(ARGV[2], '0')
place(KEYS[2], KEYS[3], ARGV[1], open, not open)
return {ARGV[2], 1}
"""

# KEYS: record, index, finished index. ARGV: txn, state, has_body('1'|'0'), participants,
# coordinator, redo. A rewrite of a tombstone's own decision keeps its expiry (HSET leaves it), so
# the sync leaves it out of the finished index.
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
sync_index(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
return {'OK', ARGV[2]}
"""

# KEYS: record, index, finished index, in durability "replicas:N" the log's read mark (ARGV[2]
# '1'), then the data keys. ARGV: txn, whether the mark is there ('1'|'0'), then per data key an op
# ('s'|'d') and a value. A VOTE_YES record is the participant's own, which it applies only once it knows the
# decision is COMMIT (see LogStore.apply_redo): the script records that COMMIT with the data, so
# the record leaves the unfinished index, and joins the finished one, in the same step. The
# "applied before" path bumps the mark, as log_once's found path does: an earlier attempt's apply,
# on another connection or before a WAIT that timed out, is then covered by this call's WAIT
# (found by audit, 2026-11-28).
_APPLY_REDO = _SYNC_INDEX + """
local stored = redis.call('HGET', KEYS[1], 'state')
if stored ~= 'COMMIT' and stored ~= 'VOTE_YES' then return {'NOT_COMMIT', stored or 'absent'} end
local first = 4
if ARGV[2] == '1' then first = 5 end
if redis.call('HGET', KEYS[1], 'applied') == '1' then
  if first == 5 then redis.call('INCR', KEYS[4]) end
  return {'APPLIED_BEFORE', stored}
end
for i = first, #KEYS do
  local op = ARGV[3 + 2 * (i - first)]
  if op == 's' then
    redis.call('SET', KEYS[i], ARGV[4 + 2 * (i - first)])
  else
    redis.call('DEL', KEYS[i])
  end
end
redis.call('HSET', KEYS[1], 'state', 'COMMIT', 'applied', '1')
-- Finished, and no tombstone: it was a vote or an unapplied COMMIT, which no tombstone is (an
-- ABORT one, or a COMMIT one applied), so it has no expiry.
place(KEYS[2], KEYS[3], ARGV[1], false, true)
return {'OK', 'COMMIT'}
"""

# Several deletes of ONE log (a script may only touch one hash slot, and a log's keys share one),
# each with its own fence check: what a tick's coalesced deletes cost instead of a script each.
# KEYS: index, finished index, then each record, then (only when some delete is fenced) the
# ownership record of the log's partition or node. ARGV: per delete its txn, its fence's owner and epoch ('' and ''
# unfenced), and its tombstone's decision and keep_ms ('' and '' to delete); then, once, '1' where
# a COMMIT tombstone may cover only an applied COMMIT (a partition's log), '0' where it may cover
# one never applied too (a coordinator's: contract.commit_tombstone_needs_applied). The rule is
# `check_tombstone`'s: a COMMIT tombstone never over a vote, nor over the other decision. Replies
# {results, ownership}: per delete 1 (it existed), 0 (absent), -1 (fenced) or, for a tombstone
# refused, the stored 'state:applied' (the caller raises what `check_tombstone` says; nothing was
# written), and the ownership record's fields if any delete was fenced. A tombstone is the record
# with its body emptied, applied where it is a COMMIT (so no scan finds it, in either kind of log),
# and a key expiry: Redis drops it keep_ms after this script, by its own clock. Either way the
# record leaves both indexes (`place`d in neither: what `sync_index` would find, unread).
_DELETE_MANY = _SYNC_INDEX + """
local commit_needs_applied = table.remove(ARGV) == '1'
local count = #ARGV / 5
local owner_key = KEYS[count + 3]
local held
local refused = false
local results = {}
for i = 1, count do
  local fence_owner = ARGV[5 * i - 3]
  if fence_owner ~= '' then
    held = held or redis.call('HMGET', owner_key, 'owner', 'epoch')
    if held[1] ~= fence_owner or held[2] ~= ARGV[5 * i - 2] then
      results[i] = -1
      refused = true
    end
  end
  local decision = ARGV[5 * i - 1]
  local record_key = KEYS[i + 2]
  if results[i] then
  elseif decision == '' then
    place(KEYS[1], KEYS[2], ARGV[5 * i - 4], false, false)
    results[i] = redis.call('DEL', record_key)
  else
    local stored = redis.call('HMGET', record_key, 'state', 'applied')
    local state, applied = stored[1], stored[2]
    if state and ((state ~= 'VOTE_YES' and state ~= decision)
                  or (decision == 'COMMIT' and (state == 'VOTE_YES' or (commit_needs_applied and applied ~= '1')))) then
      results[i] = state .. ':' .. applied
    else
      if not state then redis.call('HSET', record_key, 'created_at_ms', now_ms()) end
      redis.call('HSET', record_key, 'state', decision, 'participants', '[]', 'coordinator', '', 'redo', '',
                 'applied', decision == 'COMMIT' and '1' or '0')
      redis.call('PEXPIRE', record_key, ARGV[5 * i])
      place(KEYS[1], KEYS[2], ARGV[5 * i - 4], false, false)
      results[i] = state and 1 or 0
    end
  end
end
if refused then return {results, redis.call('HGETALL', owner_key)} end
return {results, {}}
"""

# What a finished scan found stale in the finished index (a record gone, a tombstone, one not
# finished): each member's record read again and its membership set by the rule, in one atomic
# step, so that a record re-created or finished since the scan read it keeps its place. KEYS:
# finished index, then each record. ARGV: each record's txn. Sent without _DEADLINE: it only
# brings the index in line with the records, whenever it lands.
_PRUNE_FINISHED = _SYNC_INDEX + """
for i = 1, #ARGV do
  local _, is_finished = belongs(KEYS[i + 1])
  if is_finished then redis.call('ZADD', KEYS[1], 0, ARGV[i]) else redis.call('ZREM', KEYS[1], ARGV[i]) end
end
return #ARGV
"""

# The backfill of records finished before the finished index existed (the module docstring):
# each record a SCAN met is read again here, in the same atomic step as its ZADD, by `belongs`, the
# very rule every script keeps the index by, so a record a node's script changed since the SCAN is
# judged as it is now, and one it changes later is moved by that script. Only adds: a member that
# is stale is the scan's to prune. KEYS: the finished index, then records of its log. ARGV: each
# record's txn, then '1' for a dry run (nothing written). Replies the counts of the records indexed
# (or, dry, that would be), already members, unfinished, tombstones (finished, with an expiry),
# and others (gone since the SCAN, or a hash without a state: no record). Sent without _DEADLINE,
# and without a WAIT in durability "replicas:N", as _PRUNE_FINISHED is: it only brings the index in
# line with the records, whenever it lands, and a member a failover loses is left out as before.
_BACKFILL_FINISHED = _SYNC_INDEX + """
local dry = table.remove(ARGV) == '1'
local counts = {0, 0, 0, 0, 0}
for i = 1, #ARGV do
  local is_unfinished, is_finished = belongs(KEYS[i + 1])
  local outcome = 5
  if is_finished then
    local added
    if dry then added = not redis.call('ZSCORE', KEYS[1], ARGV[i]) else
      added = redis.call('ZADD', KEYS[1], 'NX', 0, ARGV[i]) == 1
    end
    outcome = added and 1 or 2
  elseif is_unfinished then
    outcome = 3
  elseif redis.call('HEXISTS', KEYS[i + 1], 'state') == 1 then
    outcome = 4
  end
  counts[outcome] = counts[outcome] + 1
end
return counts
"""

# A record's read in durability "replicas:N" (the module docstring says why it writes).
_READ_REPLICATED = """
local fields = redis.call('HGETALL', KEYS[1])
redis.call('INCR', KEYS[2])
return fields
"""

# Prepended to every write script: the caller appends its call's deadline (unix ms) to ARGV, and
# the script refuses to run past it. Redis runs a call whenever it arrives, and one still on the
# network (or queued behind a slow server) when its caller was told it failed could otherwise land
# later: garbage collection's grace counts on calls landing within their deadline plus the clock
# slack (DESIGN section 4), and a vote landing after its transaction's records were collected
# would re-create one. Taken off ARGV first, so the script below sees its usual arguments.
_DEADLINE = """
local deadline_ms = tonumber(table.remove(ARGV))
local now = redis.call('TIME')
if tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) > deadline_ms then return {'LATE'} end
"""

# Prepended to a script to make its fenced variant: the caller appends the ownership record's key
# to KEYS and the fence's owner and epoch to ARGV; they are taken off again here, so the script
# below sees the same KEYS and ARGV as its unfenced form (and unfenced calls pay nothing).
_FENCE = """
local fence_epoch = table.remove(ARGV)
local fence_owner = table.remove(ARGV)
local owner_key = table.remove(KEYS)
local held = redis.call('HMGET', owner_key, 'owner', 'epoch')
if held[1] ~= fence_owner or held[2] ~= fence_epoch then
  return {'FENCED', redis.call('HGETALL', owner_key)}
end
"""

# KEYS: ownership record. ARGV: expected epoch and version ('' for none: the record must be
# absent), then the new owner, epoch, version, lease_ms, wanted_by.
_WRITE_OWNER = """
local stored = redis.call('HMGET', KEYS[1], 'epoch', 'version')
local matches
if ARGV[1] == '' then matches = not stored[1] else matches = stored[1] == ARGV[1] and stored[2] == ARGV[2] end
if matches then
  redis.call('HSET', KEYS[1], 'owner', ARGV[3], 'epoch', ARGV[4], 'version', ARGV[5], 'lease_ms', ARGV[6],
             'wanted_by', ARGV[7])
end
return {matches and 1 or 0, redis.call('HGETALL', KEYS[1])}
"""

# Redis enforces each write's deadline by its own clock (the script reads TIME), so the node
# states the deadline in Redis's clock: its boot clock plus the offset it measured (TIME, read
# between two readings of that clock). Measured at open and again this often (Redis's clock
# drifts, and NTP steps it); the estimate errs early by at most a round trip, so a deadline is
# never later in Redis's clock than the caller's. (Found by review: stated in the node's clock, a
# Redis whose clock ran behind by more than the slack let a late write land past the GC grace.
# Found by audit: measured against the node's wall clock, an NTP step of that clock between two
# measurements moved every deadline by the step.) Redis's own clock stepped back between two
# measurements still moves deadlines later by the step until the next; its key expiry moves with
# it too, and only its operators' NTP settings (slewing, not stepping) can rule that out.
CLOCK_OFFSET_REFRESH_S = 30.0
# A skew this large (clock_slack_ms's default) is logged as an error: deadlines stay right, but
# leases and the begin times in transaction ids rest on the nodes' clocks agreeing too.
CLOCK_SKEW_MS_WARN = 1_000


def _now_ms() -> float:
    """The node's clock that deadlines in Redis's clock are counted from, in milliseconds: the
    boot clock, which no step of the wall clock moves."""
    return boot_clock_s() * 1000


def _wall_ms() -> float:
    """This node's wall clock, in milliseconds (a function, so that a test can skew it)."""
    return time.time() * 1000

# A stored state as Redis answers it (a dict lookup: TxnState(...) is two Python calls).
_STATES = {state.value.encode(): state for state in TxnState}
# The calls whose scripts go over the pipelined connection, which bounds each by its own timer.
_PIPED_CALLS = frozenset({"log_once", "log", "apply_redo", "delete"})


class MarkLost(redis.exceptions.ConnectionError):
    """A new redis-py connection found the store's mark gone: a ConnectionError, so that redis-py
    drops the connection instead of handing it out; the store answers InvariantViolation."""


class _ConnectionCheck(ConnectCheck):
    """What the store asks of each new pipelined connection, in the round trip that sets it up:
    that the store's mark is still there, and Redis's clock. A new connection may reach another
    server than the last (a failover behind one address), whose clock differs: measured before
    its first write, not up to CLOCK_OFFSET_REFRESH_S later (found by audit, 2026-11-28, second:
    those writes carried deadlines in the old server's clock)."""

    __slots__ = ("store", "wall_before_ms")

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.wall_before_ms = 0.0

    def commands(self) -> Sequence[Sequence[Any]]:
        self.wall_before_ms = _wall_ms()
        return [("GET", STORE_MARK_KEY), ("TIME",)]

    def verdict(self, replies: Sequence[Any]) -> Exception | None:
        found, (seconds, microseconds) = replies
        refusal = self.store._mark_refusal(found)
        if refusal is None:
            self.store._note_clock(int(seconds), int(microseconds), self.wall_before_ms)
        return refusal


def _tag(log: LogId) -> str:
    return "{" + log.key + "}"


def _read_mark_key(log: LogId) -> str:
    return f"{TXN_PREFIX}:{_tag(log)}:{_READ_MARK}"


def _record_key(log: LogId, txn: str) -> str:
    return f"{TXN_PREFIX}:{_tag(log)}:{txn}"


def _index_key(log: LogId) -> str:
    return f"{TXN_PREFIX}:{_tag(log)}:{_UNFINISHED}"


def _finished_key(log: LogId) -> str:
    return f"{TXN_PREFIX}:{_tag(log)}:{_FINISHED}"


def _data_key(partition: str, key: str) -> str:
    return f"{DATA_PREFIX}:{_tag(LogId.partition(partition))}:{key}"


def _owner_key(name: str) -> str:
    """A partition's ownership record, or a node's identity record: each in the slot of the log
    its fence guards (the partition's log, the node's coordinator log)."""
    if is_identity(name):
        return f"{OWNER_PREFIX}:{_tag(LogId.coordinator(name[len(IDENTITY_PREFIX):]))}"
    return f"{OWNER_PREFIX}:{_tag(LogId.partition(name))}"


def _owner_from_flat(partition: str, flat: Sequence[bytes]) -> Ownership | None:
    """An ownership record from HGETALL's reply (a dict, or a flat list inside a script reply)."""
    fields = dict(flat) if isinstance(flat, dict) else dict(zip(flat[::2], flat[1::2], strict=True))
    if not fields:
        return None
    return Ownership(
        partition, fields[b"owner"].decode(), int(fields[b"epoch"]), int(fields[b"version"]),
        int(fields[b"lease_ms"]), fields[b"wanted_by"].decode(),
    )


def _redacted(url: str) -> str:
    """`url` fit for a log line or an error: host, port and database, never the credentials."""
    address = parse_url(url)
    return f"{address.get('host', '?')}:{address.get('port', '?')}/{address.get('db', 0)}"


def _tombstone_refusal(log: LogId, txn: str, stored: bytes, keep: Tombstone) -> StorageError:
    """The error `check_tombstone` raises for what the script found ('state:applied')."""
    state, _, applied = stored.partition(b":")
    try:
        check_tombstone(log, txn, _STATES[state], applied == b"1", keep)
    except StorageError as error:
        return error
    raise AssertionError(f"the script refused a tombstone of {keep.decision} over {stored!r}, which is allowed")


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


# The fields a finished scan reads of each record, in this order: all but the redo, which the
# contract leaves out (a collector needs none of it, and it is most of a record's bytes).
_FINISHED_FIELDS = ("state", "applied", "created_at_ms", "participants", "coordinator")


def _finished_record(log: LogId, txn: str, values: Sequence[bytes | None], ttl_ms: int) -> Record | None:
    """The record a finished scan read (HMGET of _FINISHED_FIELDS, and its PTTL), without its
    redo; None unless it exists, is finished and has no expiry (PTTL -1: not a tombstone)."""
    state_name, applied_flag, created_at_ms, participants, coordinator = values
    if state_name is None or ttl_ms != -1:
        return None
    state, applied = _STATES[state_name], applied_flag == b"1"
    if is_unfinished(state, applied):
        return None
    assert created_at_ms is not None and participants is not None and coordinator is not None, (txn, values)
    return Record(
        log=log,
        txn=txn,
        state=state,
        body=RecordBody(tuple(json.loads(participants)), coordinator.decode(), b""),
        applied=applied,
        created_at_ms=int(created_at_ms),
    )


@dataclass(frozen=True, slots=True)
class FinishedBackfill:
    """What `RedisStore.backfill_finished_index` did: the record keys its SCANs returned (`walked`;
    a key SCAN returns twice, as it may across a rehash, counts twice), and what became of each:
    added to its log's finished index (in a dry run, would have been), a member already, or
    skipped: unfinished (a vote, a COMMIT not applied, any COMMIT of a coordinator's log), a
    tombstone, or other (gone since the SCAN, the cluster record, a hash under the prefix that is no
    record). `resume_cursor`: where the next run goes on, None once the walk reached the end."""

    walked: int = 0
    indexed: int = 0
    already_indexed: int = 0
    unfinished: int = 0
    tombstones: int = 0
    other: int = 0
    resume_cursor: int | None = None

    @property
    def skipped(self) -> int:
        return self.unfinished + self.tombstones + self.other

    def plus(self, batch: FinishedBackfill, resume_cursor: int | None) -> FinishedBackfill:
        """This run's counts with `batch`'s added, going on from `resume_cursor`."""
        return FinishedBackfill(
            self.walked + batch.walked, self.indexed + batch.indexed, self.already_indexed + batch.already_indexed,
            self.unfinished + batch.unfinished, self.tombstones + batch.tombstones, self.other + batch.other,
            resume_cursor,
        )


def validate_backfill(cursor: object, key_count_max: object, scan_count: object) -> None:
    """ValidationError unless the bounds of a backfill run are usable (before any I/O)."""
    for name, value, low, high in (("cursor", cursor, 0, SCAN_CURSOR_MAX),
                                   ("key_count_max", key_count_max, 1, BACKFILL_KEY_COUNT_MAX),
                                   ("scan_count", scan_count, 1, BACKFILL_SCAN_COUNT_MAX)):
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ValidationError(f"{name} must be an integer in {low}..{high}, got {value!r}")


def _url_options(connection_class: type) -> frozenset[str]:
    """The query options a Redis URL may carry: redis-py hands each to its connection pool and
    connection classes as a keyword, and one none of them takes fails at the first connection with
    a TypeError, long after the URL was read."""
    names: set[str] = set()
    for cls in (*connection_class.__mro__, aioredis.BlockingConnectionPool, aioredis.ConnectionPool):
        init = cls.__dict__.get("__init__")
        if init is not None:
            names.update(name for name, parameter in inspect.signature(init).parameters.items()
                         if parameter.kind in (parameter.KEYWORD_ONLY, parameter.POSITIONAL_OR_KEYWORD))
    return frozenset(names - {"self"})


def validate_url(url: str) -> None:
    """ValidationError, naming no credentials, unless redis-py can take `url`: the scheme, the
    port, a database number, known options. What it cannot tell: whether the server answers, or has
    that database."""
    try:
        address = parse_url(url)
    except ValueError as error:
        raise ValidationError(f"redis URL: {error}") from None
    parts = urlsplit(url)
    database = parts.path.strip("/")
    if parts.scheme != "unix" and database and not (database.isascii() and database.isdigit()):
        raise ValidationError(f"redis URL: the database must be a number, got {database!r}")
    known = _url_options(address.get("connection_class", aioredis.Connection))
    unknown = sorted({name for name, _ in parse_qsl(parts.query)} - known - {"db"})
    if unknown:
        raise ValidationError(f"redis URL: unknown option(s) {', '.join(unknown)}")


def _finished_key_of_record(key: bytes) -> tuple[str, str] | None:
    """The finished index and txn id of the record at `key`, which a SCAN of `cxtxn:*` returned;
    None where it is no record of a partition's or coordinator's log (a hash of another program, the
    cluster record, whose log keeps no finished index)."""
    try:
        text = key.decode("ascii")
    except UnicodeDecodeError:
        return None
    prefix = f"{TXN_PREFIX}:{{"
    tag_end = text.find("}", len(prefix))
    if not text.startswith(prefix) or tag_end < 0:
        return None
    kind, _, name = text[len(prefix):tag_end].partition(".")
    txn = text[tag_end + 2:]
    try:
        log = {"p": LogId.partition, "c": LogId.coordinator}[kind](name)
        validate_txn(txn)
    except (KeyError, ValidationError):
        return None
    if _record_key(log, txn) != text:  # the separator after the tag, a name that formats otherwise
        return None
    return _finished_key(log), txn


class RedisStore(LogStore):
    """LogStore over Redis. Open with `await RedisStore.open("redis://127.0.0.1:6379/0")`."""

    backend_name = "redis"
    coalesces_deletes = True
    drops_tombstones_at_expiry = True

    def __init__(self, client: aioredis.Redis, timeout_ms_call: int, replica_count: int = 0) -> None:
        super().__init__(timeout_ms_call)
        assert replica_count >= 0, replica_count
        self._client = client
        # Replicas that must have a write before it is answered (durability "replicas:N"), and
        # how long a WAIT for them may take.
        self._replica_count = replica_count
        self._timeout_ms_replica_wait = max(1, int(timeout_ms_call * REPLICA_WAIT_SHARE_OF_CALL))
        self._scripts = {
            source: client.register_script(_DEADLINE + source) for source in (_LOG_ONCE, _LOG, _APPLY_REDO)
        }
        self._fenced = {
            source: client.register_script(_DEADLINE + _FENCE + source) for source in (_LOG_ONCE, _LOG, _APPLY_REDO)
        }
        self._delete_many_script = client.register_script(_DEADLINE + _DELETE_MANY)
        self._read_replicated_script = client.register_script(_DEADLINE + _READ_REPLICATED)
        self._prune_finished_script = client.register_script(_PRUNE_FINISHED)
        self._backfill_finished_script = client.register_script(_BACKFILL_FINISHED)
        # With the deadline every write carries (found by audit: a take its node was told failed
        # landed later, naming a node that served nothing, or deposing a live process).
        self._write_owner_script = client.register_script(_DEADLINE + _WRITE_OWNER)
        # The hot scripts go over one pipelined connection (resp_pipe.py); None: a TLS or Unix
        # socket URL, where they go through redis-py like every other call.
        self._pipe: RespPipe | None = None
        # Redis's clock minus this node's boot clock, in ms, as measured (CLOCK_OFFSET_REFRESH_S),
        # and when; the measurement in flight, one at a time. Until measured (open measures it),
        # the node's wall clock stands in for Redis's.
        self._clock_offset_ms = _wall_ms() - _now_ms()
        self._clock_measured_s = -math.inf
        self._clock_measuring: asyncio.Task[None] | None = None
        # The server, as messages name it (no credentials).
        self._where = "redis"
        # What the store's mark held at open (None until then: nothing checks it), and, once a
        # new connection found it gone, why every call is refused.
        self._mark: bytes | None = None
        self._lost: str | None = None

    @property
    def where(self) -> str:
        """The server as messages name it: host, port and database, no credentials."""
        return self._where

    @property
    def _calls_bounded_by_io(self) -> frozenset[str]:  # type: ignore[override]
        # The pipe's bare timer per call is the deadline (see LogStore._calls_bounded_by_io).
        return _PIPED_CALLS if self._pipe is not None else frozenset()

    @classmethod
    async def open(cls, url: str, *, timeout_ms_call: int = TIMEOUT_MS_CALL_DEFAULT,
                   durability: str = "aof", replica_count: int = 0) -> RedisStore:
        """`durability`: what the server must guarantee before it answers a write, "aof",
        "replicas" (then `replica_count` of them) or "none" (storage_adapters.factory
        .REDIS_DURABILITIES), checked here."""
        assert (durability == "replicas") == (replica_count > 0), (durability, replica_count)
        timeout_s = timeout_ms_call / 1000
        store: RedisStore | None = None

        async def connected(connection: Any) -> None:
            """redis-py's set-up of each new connection (AUTH, SELECT, ...), then the check of
            the store's mark, before the connection serves any call."""
            if store is not None and store._lost is not None:
                raise MarkLost(store._lost)  # no command sent: the server is refused for good
            await connection.on_connect()
            if store is not None:
                await store._check_mark_on(connection)

        # A blocking pool: a burst of calls beyond CONNECTION_COUNT_MAX waits for a connection
        # (within the call's deadline) instead of failing at once with "Too many connections"
        # (a recovery that collects thousands of old records did exactly that).
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=CONNECTION_COUNT_MAX,
            timeout=timeout_s,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            # The caller owns retries (it knows whether the call is idempotent at its level); a
            # hidden client retry would also stretch a call past its deadline.
            retry=Retry(NoBackoff(), 0),
            decode_responses=False,
            redis_connect_func=connected,
        )
        client = aioredis.Redis.from_pool(pool)  # the client owns the pool: closing it closes the pool
        store = cls(client, timeout_ms_call, replica_count)
        store._where = _redacted(url)
        address = parse_url(url)
        if "connection_class" not in address:  # plain TCP
            store._pipe = RespPipe(
                # redis-py's defaults where the URL names none (found by audit: "redis://host/0",
                # which its own pool takes, failed here with a KeyError).
                RespAddress(address.get("host", "localhost"), address.get("port", 6379), address.get("db", 0),
                            address.get("username"), address.get("password")),
                timeout_ms_call, replica_count, store._timeout_ms_replica_wait if replica_count else 0,
                timeout_ms_silence=timeout_ms_call,
            )
        try:
            await store._bounded(client.ping(), "PING")
            await ServerCheck(client, store._bounded, store._where, replica_count).refuse_unsafe(durability)
            await store._bounded(store._write_mark(), "the store's mark")
            if store._pipe is not None:
                # Only now: the pipe connects at its first call, which comes after open.
                store._pipe.connect_check = _ConnectionCheck(store)
            await store._measure_clock()
        except BaseException:
            await store.close()
            raise
        return store

    async def _replicated(self, queue: Callable[[Any], Awaitable[Any]]) -> Any:
        """The reply of the write that `queue` puts on a redis-py pipeline, answered once the
        replicas asked for have it (WAIT, on the pipeline's connection: it waits for that
        connection's writes). Where the pipelined connection is not used (TLS, a Unix socket),
        and for ownership writes."""
        async with self._client.pipeline(transaction=False) as pipe:
            await queue(pipe)
            pipe.execute_command("WAIT", self._replica_count, self._timeout_ms_replica_wait)
            reply, replicated = await pipe.execute()
        if replicated < self._replica_count:
            raise NotReplicated.of(replicated, self._replica_count, self._timeout_ms_replica_wait)
        return reply

    async def _write_mark(self) -> None:
        """Give the storage its mark where it has none, and keep what it holds (the module
        docstring). One round trip: SET NX and GET, no script, which a proxy may not pass; with
        replicas, and their WAIT, since a failover that lost the mark would stop every node as if
        the data were lost."""
        pipeline = self._client.pipeline(transaction=False)
        pipeline.set(STORE_MARK_KEY, uuid.uuid4().hex, nx=True)
        pipeline.get(STORE_MARK_KEY)
        if self._replica_count:
            pipeline.execute_command("WAIT", self._replica_count, self._timeout_ms_replica_wait)
        replies = await pipeline.execute()
        if self._replica_count and (not isinstance(replies[2], int) or replies[2] < self._replica_count):
            raise NotReplicated.of(replies[2], self._replica_count, self._timeout_ms_replica_wait)
        mark = replies[1]
        if not isinstance(mark, bytes) or not mark:
            raise InvariantViolation(f"redis at {self._where} did not keep the store's mark {STORE_MARK_KEY} it "
                                     f"was just given: it holds {mark!r}")
        self._mark = mark

    def _mark_refusal(self, found: object) -> InvariantViolation | None:
        """None if a new connection found the store's mark as it was at open; else the refusal of
        every call from now on (the module docstring)."""
        assert self._mark is not None, "checked only once open found the mark"
        if self._lost is None and found == self._mark:
            return None
        if self._lost is None:
            held = "is gone" if found is None else f"holds another value ({found!r}: a store opened on it since)"
            self._lost = (
                f"redis at {self._where} lost its data: the store's mark {STORE_MARK_KEY}, there when this store "
                f"opened, {held}. It restarted without persistence, was flushed, or failed over to a replica "
                "without the data; what it answers now would let a terminator's ABORT fill the slot of a vote "
                "whose transaction committed. Every call is refused and nothing is written: restore the data (or "
                "know it lost nothing Cornus needs) before starting nodes on it again"
            )
            log.critical("%s", self._lost)
        return InvariantViolation(self._lost)

    async def _check_mark_on(self, connection: Any) -> None:
        """MarkLost unless a new redis-py connection finds the store's mark as it was at open (one
        round trip, bounded by the socket timeout, the call's). Before open wrote it, nothing."""
        if self._mark is None:
            return
        await connection.send_command("GET", STORE_MARK_KEY)
        refusal = self._mark_refusal(await connection.read_response())
        if refusal is not None:
            raise MarkLost(str(refusal))

    def _refuse_if_lost(self) -> None:
        """InvariantViolation, before any I/O, once the server was found to have lost its data."""
        if self._lost is not None:
            raise InvariantViolation(self._lost)

    async def _measure_clock(self) -> None:
        """Measure Redis's clock against this node's (CLOCK_OFFSET_REFRESH_S)."""
        wall_before_ms = _wall_ms()
        seconds, microseconds = await self._bounded(self._client.time(), "TIME")
        self._note_clock(seconds, microseconds, wall_before_ms)

    def _note_clock(self, seconds: int, microseconds: int, wall_before_ms: float) -> None:
        """Take Redis's TIME, just answered to a request sent at `wall_before_ms` (this node's wall
        clock), as the offset of Redis's clock from this node's boot clock."""
        after_ms = _now_ms()
        wall_after_ms = _wall_ms()
        assert wall_before_ms > 0 and 0 <= microseconds < 1_000_000, (wall_before_ms, microseconds)
        redis_ms = seconds * 1000 + microseconds / 1000
        # Redis read its clock before our second reading: the offset is at least this, which is
        # the one used, so that a deadline stated with it is never later than the caller's.
        self._clock_offset_ms = redis_ms - after_ms
        self._clock_measured_s = time.monotonic()
        # The wall clocks' skew, which deadlines no longer rest on, but leases and the begin
        # times in transaction ids do.
        skew_ms = redis_ms - (wall_before_ms + wall_after_ms) / 2
        if abs(skew_ms) > CLOCK_SKEW_MS_WARN:
            log.error("redis's clock is %.0f ms %s this node's: deadlines allow for it, but fix the clocks (NTP)",
                      abs(skew_ms), "ahead of" if skew_ms > 0 else "behind")

    def _refresh_clock(self) -> None:
        if self._clock_measuring is not None or time.monotonic() - self._clock_measured_s < CLOCK_OFFSET_REFRESH_S:
            return

        async def measure() -> None:
            try:
                await self._measure_clock()
            except Exception as error:  # any: the next call tries again, and the last offset stands
                log.warning("redis clock offset not measured: %s: %s", type(error).__name__, error)
            finally:
                self._clock_measuring = None

        self._clock_measuring = asyncio.get_running_loop().create_task(measure(), name="cornus-redis-clock")

    def _storage_error(self, error: Exception, what: str) -> StorageError | None:
        if self._lost is not None:
            # Whatever failed (a new connection's check, MarkLost, among them): the server lost its
            # data, and that is what the caller must hear, not a retryable error.
            return InvariantViolation(self._lost)
        # BusyLoadingError is a ConnectionError: first, for its plainer message.
        if isinstance(error, redis.exceptions.BusyLoadingError):
            return StorageUnavailable(f"redis {what}: server is loading its data")
        if isinstance(error, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError | OSError):
            return StorageUnavailable(f"redis {what}: {error}")
        if isinstance(error, _NOT_SERVING_ERRORS) or (
                isinstance(error, redis.exceptions.ResponseError) and not_serving(str(error))):
            # redis-py's own calls (TLS and unix-socket stores run every script through them): it
            # turns READONLY, OOM, MASTERDOWN and TRYAGAIN into classes of their own, with the code
            # cut from the message, and cuts "ERR " from a script's error around one of them (found
            # by review: the message alone said nothing, and such a store's node exited on them).
            return StorageUnavailable(f"redis {what}: {type(error).__name__}: {error}")
        return None

    async def _run(self, source: str, keys: list[str], args: list[Any], fence: Fence | None) -> Any:
        """Run a contract script, or its fenced variant when there is a fence; Fenced if refused."""
        if fence is None:
            return await self._script(self._scripts[source], keys, args)
        reply = await self._script(
            self._fenced[source], [*keys, _owner_key(fence.partition)], [*args, fence.owner, str(fence.epoch)]
        )
        if isinstance(reply, list) and reply and reply[0] == b"FENCED":
            raise Fenced(fence, _owner_from_flat(fence.partition, reply[1]))
        return reply

    async def _script(self, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        """Run a write script (every one starts with _DEADLINE) within the call's deadline, which
        the script also enforces on its side."""
        self._refuse_if_lost()
        timeout_s = self._timeout_s
        earlier = call_deadline_if_set()
        if earlier is not None:
            timeout_s = min(timeout_s, earlier - asyncio.get_running_loop().time())
            if timeout_s <= 0:
                raise StorageUnavailable("redis: the call's deadline passed before it was sent")
        pipe = self._pipe
        if pipe is not None and not pipe.connected:
            # Connected first: the new connection measures Redis's clock as it is set up
            # (_ConnectionCheck), and this call's deadline is stated in that clock.
            loop = asyncio.get_running_loop()
            connecting_s = loop.time()
            await pipe.connect()
            timeout_s -= loop.time() - connecting_s
            if timeout_s <= 0:
                raise StorageUnavailable("redis: the call's deadline passed while it connected")
        self._refresh_clock()
        deadline_ms = int(_now_ms() + timeout_s * 1000 + self._clock_offset_ms)
        args = [*args, deadline_ms]
        if pipe is None:
            # The script refuses to run past deadline_ms.
            if self._replica_count:
                reply = await self._replicated(lambda pipeline: script(keys=keys, args=args, client=pipeline))
            else:
                reply = await script(keys=keys, args=args)
        else:
            reply = await pipe.evalsha(script.sha, script.script, keys, args, timeout_s)
        if isinstance(reply, list) and reply == [b"LATE"]:
            early_ms = deadline_ms - (_now_ms() + self._clock_offset_ms)
            if early_ms > CLOCK_SKEW_MS_WARN:
                # Answered well before the deadline as the offset has it: a clock stepped since
                # it was measured. Measured again now; said loudly.
                self._clock_measured_s = -math.inf
                self._refresh_clock()
                log.error("redis refused a call as past its deadline %.0f ms before that deadline by the measured "
                          "clock offset: a clock was stepped; measuring it again", early_ms)
            raise StorageUnavailable("redis refused a call that reached it past its deadline")
        return reply

    async def _log_once(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody, fence: Fence | None
    ) -> LogOnceResult:
        keys = [_record_key(log, txn), _index_key(log), _finished_key(log)]
        if self._replica_count:
            keys.append(_read_mark_key(log))
        reply = await self._run(
            _LOG_ONCE, keys, [txn, state.value, json.dumps(body.participants), body.coordinator, body.redo], fence,
        )
        stored, created = _STATES[reply[0]], reply[1] == 1
        assert stored is state or not created, "a created record holds what we wrote"
        return LogOnceResult(stored, created)

    async def _log(
        self, log: LogId, txn: str, state: TxnState, body: RecordBody | None, fence: Fence | None
    ) -> TxnState:
        body_args: list[Any] = (
            ["0", "", "", b""]
            if body is None
            else ["1", json.dumps(body.participants), body.coordinator, body.redo]
        )
        verdict, stored = await self._run(
            _LOG, [_record_key(log, txn), _index_key(log), _finished_key(log)], [txn, state.value, *body_args], fence
        )
        if verdict == b"REFUSED":
            raise DecisionFlipRefused(log, txn, TxnState(stored.decode()), state)
        assert verdict == b"OK" and stored.decode() == state.value
        return state

    async def _read(self, log: LogId, txn: str) -> Record | None:
        self._refuse_if_lost()
        if self._replica_count:
            flat = await self._script(self._read_replicated_script, [_record_key(log, txn), _read_mark_key(log)], [])
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
        else:
            fields = await self._client.hgetall(_record_key(log, txn))
        return _record_from_hash(log, txn, fields) if fields else None

    async def _scan_page(self, log: LogId, limit: int, after: str) -> ScanPage:
        records, full = await self._scan_records(log, limit, after)
        return whole_page(records, limit, cut=full)

    async def _members_after(self, index_key: str, start: str, count: int) -> list[str]:
        """Up to `count` txn ids of an index (`~unfinished`, `~finished`) after `start` ("": from
        the first), in order. "(" makes the bound exclusive; "-" is the smallest member.
        ZRANGEBYLEX, not ZRANGE BYLEX, which only Redis 6.2 knows (found by audit: an older
        server's syntax error ended every node at its first recovery)."""
        members = await self._client.zrangebylex(index_key, f"({start}" if start else "-", "+", start=0, num=count)
        txns = [member.decode() for member in members]
        assert txns == sorted(txns) and all(txn > start for txn in txns)
        return txns

    async def _scan_records(self, log: LogId, limit: int, after: str) -> tuple[list[Record], bool]:
        """The page's records, and whether it ended at SCAN_PAGE_BYTES_MAX. They are read
        SCAN_READ_CHUNK_COUNT at a time, so a page of large records stops reading with the chunk in which
        it fills (at most a chunk's worth past the bound held at once)."""
        self._refuse_if_lost()
        index_key = _index_key(log)
        records: list[Record] = []
        page_bytes = PageBytes()
        start = after
        for _ in range(SCAN_ROUND_COUNT_MAX):
            wanted = limit - len(records)
            txns = await self._members_after(index_key, start, wanted)
            for first in range(0, len(txns), SCAN_READ_CHUNK_COUNT):
                chunk = txns[first:first + SCAN_READ_CHUNK_COUNT]
                pipe = self._client.pipeline(transaction=False)
                for txn in chunk:
                    pipe.hgetall(_record_key(log, txn))
                rows = await pipe.execute()
                # A record finished or deleted between the two round trips left the index after
                # we read it: it needs no work, so it is dropped and the page refilled beyond it.
                for txn, fields in zip(chunk, rows, strict=True):
                    record = _record_from_hash(log, txn, fields) if fields else None
                    if record is not None and is_unfinished(record.state, record.applied):
                        records.append(record)
                        if page_bytes.add(record):
                            return records, True
            if len(txns) < wanted or len(records) == limit:
                return records, False
            start = txns[-1]
        raise StorageUnavailable(
            f"redis scan of {log.key}: records kept finishing under it for {SCAN_ROUND_COUNT_MAX} rounds"
        )

    async def _scan_finished_page(self, log: LogId, limit: int, after: str) -> ScanPage:
        """The finished index's members after `after` (ZRANGEBYLEX), each record read again, every
        field but the redo, SCAN_READ_CHUNK_COUNT to a round trip, and returned only where it is
        still finished and not a tombstone: the index is a hint (the module docstring). A member
        that fails that is skipped, pruned (`_PRUNE_FINISHED`, a round trip of its own, only for
        a chunk that had one) and the page refilled from further on, for at most
        SCAN_ROUND_COUNT_MAX rounds; then the page is returned short, resuming after the last
        member read, as the contract allows (unlike the unfinished scan, which fails there: its
        members stay until recovery resolves them, these were pruned, so the next page moves on)."""
        self._refuse_if_lost()
        finished_key = _finished_key(log)
        record_prefix = _record_key(log, "")  # the tag's formatting once per page, not per record
        records: list[Record] = []
        page_bytes = PageBytes()
        start = after
        for _ in range(SCAN_ROUND_COUNT_MAX):
            wanted = limit - len(records)
            txns = await self._members_after(finished_key, start, wanted)
            for first in range(0, len(txns), SCAN_READ_CHUNK_COUNT):
                chunk = txns[first:first + SCAN_READ_CHUNK_COUNT]
                # MULTI: a record's fields and its expiry are read in one step, so both describe
                # one version of it (another client's script may land between two commands of a
                # plain pipeline: a tombstone's fields with a later record's expiry).
                pipe = self._client.pipeline(transaction=True)
                for txn in chunk:
                    pipe.hmget(record_prefix + txn, _FINISHED_FIELDS)
                    pipe.pttl(record_prefix + txn)
                rows = await pipe.execute()
                stale: list[str] = []
                cut = None
                for index, txn in enumerate(chunk):
                    record = _finished_record(log, txn, rows[2 * index], rows[2 * index + 1])
                    if record is None:
                        stale.append(txn)
                        continue
                    records.append(record)
                    if page_bytes.add(record):
                        cut = record.txn
                        break
                if stale:
                    await self._prune_finished(log, stale)
                if cut is not None:
                    return ScanPage(tuple(records), cut)
            if len(txns) < wanted:
                return ScanPage(tuple(records), None)
            if len(records) == limit:
                return ScanPage(tuple(records), records[-1].txn)
            start = txns[-1]
        return ScanPage(tuple(records), start)

    async def _prune_finished(self, log: LogId, txns: Sequence[str]) -> None:
        """Bring the finished index's members `txns` (at most a read chunk) in line with their
        records: one script, which reads each again, so a record re-created or finished since the
        scan read it keeps its place. Through redis-py with no deadline of its own (the scan's
        timer bounds it) and no WAIT: the index is a hint, whenever this lands."""
        assert 0 < len(txns) <= SCAN_READ_CHUNK_COUNT, len(txns)
        record_prefix = _record_key(log, "")
        keys = [_finished_key(log), *(record_prefix + txn for txn in txns)]
        pruned = await self._prune_finished_script(keys=keys, args=list(txns))
        assert pruned == len(txns), (pruned, txns)

    async def backfill_finished_index(
        self, *, cursor: int = 0, key_count_max: int = BACKFILL_KEY_COUNT_DEFAULT,
        scan_count: int = BACKFILL_SCAN_COUNT_DEFAULT, dry_run: bool = False,
        on_batch: Callable[[FinishedBackfill], None] | None = None,
    ) -> FinishedBackfill:
        """Add to its log's finished index every record that is finished and no tombstone and is
        not a member yet: the records finished by scripts of an earlier version (the module
        docstring). Walks the keyspace from `cursor` (0: the start) with SCAN MATCH `cxtxn:*` TYPE
        hash (Redis 6.0 or later), `scan_count` keys looked at a call, and stops at the walk's end
        or at the first batch that brings its records to `key_count_max`, saying where to resume.
        Each batch's records are re-checked and added by scripts of `BACKFILL_SCRIPT_KEY_COUNT_MAX`
        records of one log each (one hash slot), all sent in one pipeline; `dry_run` only counts.
        Safe beside running nodes, and to run again: see `_BACKFILL_FINISHED`. Every round trip
        has the store's call deadline; `on_batch` hears the run's counts after each batch.

        It walks the server the URL names: on a Redis Cluster, run it against each primary."""
        validate_backfill(cursor, key_count_max, scan_count)
        report = FinishedBackfill(resume_cursor=cursor)
        match = f"{TXN_PREFIX}:*"
        for _ in range(BACKFILL_SCAN_CALL_COUNT_MAX):
            self._refuse_if_lost()
            cursor, keys = await self._bounded(
                self._client.scan(cursor, match=match, count=scan_count, _type="hash"), "backfill SCAN"
            )
            batch = await self._backfill_keys(keys, dry_run)
            report = report.plus(batch, cursor or None)
            if on_batch is not None:
                on_batch(report)
            if report.resume_cursor is None or report.walked >= key_count_max:
                break
        return report

    async def _backfill_keys(self, keys: Sequence[bytes], dry_run: bool) -> FinishedBackfill:
        """The backfill of the record keys a SCAN returned (`_BACKFILL_FINISHED`), in one pipeline
        within the call deadline; the counts of the batch."""
        by_index: dict[str, list[str]] = {}
        other = 0
        for key in keys:
            found = _finished_key_of_record(key)
            if found is None:
                other += 1
            else:
                by_index.setdefault(found[0], []).append(found[1])
        counts = [0, 0, 0, 0, 0]
        if by_index:
            counts = await self._bounded(self._backfill_chunks(by_index, dry_run), "backfill")
        indexed, already_indexed, unfinished, tombstones, others = counts
        assert indexed + already_indexed + unfinished + tombstones + others + other == len(keys), (counts, keys)
        return FinishedBackfill(len(keys), indexed, already_indexed, unfinished, tombstones, others + other)

    async def _backfill_chunks(self, by_index: dict[str, list[str]], dry_run: bool) -> list[int]:
        """One script per chunk of a log's txns, pipelined; the counts summed."""
        flag = "1" if dry_run else "0"
        pipe = self._client.pipeline(transaction=False)
        for finished_key, txns in by_index.items():
            record_prefix = finished_key[: -len(_FINISHED)]
            for first in range(0, len(txns), BACKFILL_SCRIPT_KEY_COUNT_MAX):
                chunk = txns[first:first + BACKFILL_SCRIPT_KEY_COUNT_MAX]
                keys = [finished_key, *(record_prefix + txn for txn in chunk)]
                await self._backfill_finished_script(keys=keys, args=[*chunk, flag], client=pipe)
        replies = await pipe.execute()
        return [sum(int(reply[i]) for reply in replies) for i in range(5)]

    async def _read_data(self, partition: str, keys: tuple[str, ...]) -> dict[str, bytes | None]:
        if not keys:
            return {}
        self._refuse_if_lost()
        values = await self._client.mget([_data_key(partition, key) for key in keys])
        return dict(zip(keys, values, strict=True))

    async def _apply_redo(
        self, partition: str, txn: str, writes: dict[str, bytes | None], fence: Fence | None
    ) -> bool:
        log = LogId.partition(partition)
        keys = [_record_key(log, txn), _index_key(log), _finished_key(log)]
        args: list[Any] = [txn, "1" if self._replica_count else "0"]
        if self._replica_count:
            keys.append(_read_mark_key(log))
        for key, value in writes.items():
            keys.append(_data_key(partition, key))
            args.extend(["d", b""] if value is None else ["s", value])
        verdict, stored = await self._run(_APPLY_REDO, keys, args, fence)
        if verdict == b"NOT_COMMIT":
            raise InvariantViolation(
                f"apply_redo of txn {txn!r} on {partition!r}: record is {stored.decode()}, not VOTE_YES or COMMIT"
            )
        assert verdict in (b"OK", b"APPLIED_BEFORE")
        return verdict == b"OK"

    async def _delete(self, log: LogId, txn: str, fence: Fence | None, keep: Tombstone | None) -> bool:
        [outcome] = await self._delete_many([DeleteRequest(log, txn, fence, keep)])
        if isinstance(outcome, StorageError):
            raise outcome
        return outcome

    async def _delete_many(self, requests: Sequence[DeleteRequest]) -> list[bool | StorageError]:
        assert 0 < len(requests) <= DELETE_BATCH_COUNT_MAX
        by_log: dict[LogId, list[int]] = {}
        for index, request in enumerate(requests):
            by_log.setdefault(request.log, []).append(index)
        outcomes: list[bool | StorageError] = [False] * len(requests)
        if len(by_log) == 1:
            await self._delete_in_log(requests, requests[0].log, range(len(requests)), outcomes)
        else:
            # A script per log (one hash slot each); the pipe sends them all in this tick's write.
            await asyncio.gather(*(
                self._delete_in_log(requests, log, indexes, outcomes) for log, indexes in by_log.items()
            ))
        return outcomes

    async def _delete_in_log(
        self, requests: Sequence[DeleteRequest], log: LogId, indexes: Sequence[int],
        outcomes: list[bool | StorageError],
    ) -> None:
        """Delete `requests[i]` for i in `indexes` (all of `log`) in one script; answers to `outcomes`."""
        keys = [_index_key(log), _finished_key(log)]
        record_prefix = _record_key(log, "")  # the tag's formatting once per log, not per record
        args: list[str] = []
        fenced = False
        fences_of = identity_name(log.name) if log.kind is LogKind.COORDINATOR else log.name
        for index in indexes:
            request = requests[index]
            keys.append(record_prefix + request.txn)
            if request.fence is None:
                args += [request.txn, "", ""]
            else:
                # Validated: a fence guards only its own log, so all share one owner key.
                assert request.fence.partition == fences_of
                args += [request.txn, request.fence.owner, str(request.fence.epoch)]
                fenced = True
            keep = request.keep
            args += ["", ""] if keep is None else [keep.decision.value, str(keep.keep_ms)]
        args.append("1" if commit_tombstone_needs_applied(log) else "0")
        if fenced:
            keys.append(_owner_key(fences_of))
        results, owner_fields = await self._script(self._delete_many_script, keys, args)
        assert len(results) == len(indexes), f"{len(indexes)} deletes, {len(results)} answers"
        stored: Ownership | None = _owner_from_flat(fences_of, owner_fields) if owner_fields else None
        for index, result in zip(indexes, results, strict=True):
            request = requests[index]
            if result == -1:
                assert request.fence is not None, "only a fenced delete is refused"
                outcomes[index] = Fenced(request.fence, stored)
            elif isinstance(result, bytes):
                assert request.keep is not None, f"only a tombstone is refused so: {result!r}"
                outcomes[index] = _tombstone_refusal(log, request.txn, result, request.keep)
            else:
                assert result in (0, 1), result
                outcomes[index] = result == 1

    async def _read_owners(self, partitions: tuple[str, ...]) -> dict[str, Ownership]:
        self._refuse_if_lost()
        # One pipeline: one round trip, whatever the count (OWNER_READ_COUNT_MAX bounds it).
        pipeline = self._client.pipeline(transaction=False)
        for partition in partitions:
            pipeline.hgetall(_owner_key(partition))
        replies = await pipeline.execute()
        found = (_owner_from_flat(p, reply) for p, reply in zip(partitions, replies, strict=True))
        return {record.partition: record for record in found if record is not None}

    async def _write_owner(self, expected: Ownership | None, new: Ownership) -> OwnerWriteResult:
        self._refuse_if_lost()  # before the registry's ZADD, a write of its own
        if is_identity(new.partition) and (expected is None or expected.epoch != new.epoch):
            # A take of a node's identity: its node joins the registry first, in a round trip of
            # its own (another slot; see the module docstring), so that no take succeeds unlisted.
            # Idempotent: a repeated take, or one that then loses its race, changes nothing or
            # lists a node whose log is empty, which recovery scans for nothing. No WAIT of its own
            # with replicas: the take's write comes later in the replication stream, and waits.
            await self._client.zadd(IDENTITY_REGISTRY_KEY, {new.partition[len(IDENTITY_PREFIX) :]: 0})
        expected_args = ["", ""] if expected is None else [str(expected.epoch), str(expected.version)]
        keys = [_owner_key(new.partition)]
        args = [*expected_args, new.owner, str(new.epoch), str(new.version), str(new.lease_ms), new.wanted_by]
        # With replicas, _script waits for them: a take lost in a failover would let the owner it
        # fenced out write again.
        written, stored = await self._script(self._write_owner_script, keys, args)
        return OwnerWriteResult(_owner_from_flat(new.partition, stored), written == 1)

    async def _list_identities(self, after: str, limit: int) -> list[str]:
        self._refuse_if_lost()
        # One round trip: "(" makes the bound exclusive, "-" is the smallest member, and with
        # every score 0 the set is ordered by the ids' bytes. ZRANGEBYLEX, as the scan has it.
        members = await self._client.zrangebylex(
            IDENTITY_REGISTRY_KEY, f"({after}" if after else "-", "+", start=0, num=limit
        )
        nodes = [member.decode() for member in members]
        assert len(nodes) <= limit and nodes == sorted(nodes) and all(node > after for node in nodes), nodes
        return nodes

    async def close(self) -> None:
        if self._clock_measuring is not None:
            self._clock_measuring.cancel()
        if self._pipe is not None:
            await self._pipe.close()
        await self._client.aclose()
