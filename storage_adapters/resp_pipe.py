"""One pipelined Redis connection for the store's hot calls: the Lua scripts of log_once, log,
apply_redo and delete.

Why not redis-py for these: it costs about 165 us of CPU per script call on the development
machine (connection checkout, command packing, a task per socket write when a socket timeout is
set, its parser), more than the node's whole protocol step. Here a call appends one packed
EVALSHA to the tick's outgoing bytes and a future to a FIFO; the first call of a tick schedules
one write for all of them, and `hiredis` parses the replies as they arrive, in order (Redis
answers a connection's commands in the order it got them). That is about 70 us per call alone
and 20 us under load, and it is group commit for free: every call of a tick shares one write.

Every call is bounded by its deadline (a timer per call); a call that times out
leaves its reply to be read and dropped in turn, so replies never shift onto the wrong caller,
unless nothing at all came back on the connection for a whole call timeout of its owner since the
call left (whatever that call's own deadline): then the connection is taken for dead and dropped
(found by review: a connection a failover left silent, an address that went dark, took every
later call until the kernel gave up, some 15 minutes). A
lost connection fails every pending call (the caller cannot know whether its script ran, exactly
as after a timeout) and the next call connects again. NOSCRIPT (Redis lost its script cache: the
script did not run) loads the script and sends that call once more.

A new connection is set up (AUTH, SELECT, and the `connect_check` its owner gives, whose
commands ride in the same write) before any call goes out on it: the store checks there that the
server still holds what it found at open, in the round trip the connection costs anyway. A check
that refuses the server refuses it for good: the pipe never connects again, and every later call
gets the refusal.

Replicas (`replica_count` > 0, the store's "replicas:N" durability): a tick's scripts are followed
by one WAIT on the same connection, which Redis answers once that many replicas have every write
the connection made before it, or at its timeout with fewer. Each script's reply is held until
then, and a WAIT answered with fewer fails every script of its tick (NotReplicated: the write is on
the primary, and a failover may lose it). Redis blocks the connection while WAIT waits, so the
next tick's scripts queue behind it and share the next WAIT: group commit again.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import re
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import hiredis
import redis.exceptions

# Error replies that say the server cannot run a command now, whatever the command: the command
# did not run. A server loading its data after a restart, a replica after a failover, a master
# without its replicas, a script running too long, memory full, a failed background save (which
# stops writes, by Redis's default), a cluster moving slots. The caller is told storage is
# unavailable, as for a lost connection (found by review: they came back as plain errors, which
# the node takes for an impossible state and exits on). A script refused so ran none of its writes:
# Redis refuses it at the first one.
SERVER_STATE_REPLIES = frozenset({
    "LOADING", "READONLY", "MASTERDOWN", "BUSY", "OOM", "MISCONF", "NOREPLICAS", "TRYAGAIN", "CLUSTERDOWN", "MOVED",
    "ASK",
})


# Before Redis 7, an error that a script's redis.call() met comes back wrapped in the script's:
# "ERR Error running script (call to f_<sha>): @user_script:5: -READONLY You can't write ...".
# (redis-py cuts the "ERR ", so it is optional.)
_WRAPPED_IN_SCRIPT = re.compile(r"^(?:ERR )?Error running script\b.*?: -([A-Z]+)[ .]")


def not_serving(message: str) -> bool:
    """Whether an error reply says the server did not run the command for a state of its own
    (SERVER_STATE_REPLIES, also wrapped in a script's error before Redis 7), or refused the
    connection it came on (maxclients): retried later, never taken for a bug. Found by audit
    (2026-11-28): a full Redis 6 (OOM under noeviction) or a demoted one (READONLY) answered every
    write script so wrapped, and every node exited on it."""
    if message.split(" ", 1)[0] in SERVER_STATE_REPLIES or message.startswith("ERR max number of clients reached"):
        return True
    wrapped = _WRAPPED_IN_SCRIPT.match(message)
    return wrapped is not None and wrapped.group(1) in SERVER_STATE_REPLIES


class ServerNotServing(redis.exceptions.ConnectionError):
    """An error reply of SERVER_STATE_REPLIES: the command did not run."""


class NotReplicated(redis.exceptions.ConnectionError):
    """The write ran on the primary, but fewer replicas than asked had it by WAIT's timeout: its
    outcome is unknown (a failover may lose it), as after a timeout."""

    @classmethod
    def of(cls, replicated: object, wanted: int, timeout_ms: int) -> NotReplicated:
        """WAIT answered `replicated` (a count, or what came instead) of `wanted` after `timeout_ms`."""
        return cls(f"the write is on the primary but on {replicated} of the {wanted} replicas asked for after "
                   f"{timeout_ms} ms: a failover may lose it")

# Calls sent and not yet answered; past it a call is refused at once (Redis is not keeping up).
PENDING_COUNT_MAX = 16_384
# How many WAIT timeouts of silence a connection must keep before it is taken for dead: a WAIT
# that began before a call answers within one timeout of its start, so anything over one is
# silence no WAIT explains; two leave room for the WAIT's reply on a loaded machine.
WAIT_SILENCE_FACTOR = 2


class ConnectCheck(typing.Protocol):
    """What a pipe's owner asks of each new connection before any call goes out on it."""

    def commands(self) -> Sequence[Sequence[Any]]:
        """The commands to send, behind the connection's AUTH and SELECT, in the same write."""
        ...

    def verdict(self, replies: Sequence[Any]) -> Exception | None:
        """Their replies, in order (an error reply fails the connect before this is asked): None
        to use the connection, or the error that refuses the server for good."""
        ...


@dataclass(frozen=True, slots=True)
class RespAddress:
    host: str
    port: int
    db: int = 0
    username: str | None = None
    password: str | None = None


# A held outcome not yet known (a script's reply before its WAIT's), or one that a resent call
# settles instead (NOSCRIPT).
_UNSET = object()
_RESENT = object()


class _Reply:
    """What one pending slot does with its reply: settle a caller's future, or (for the
    connection's own AUTH and SELECT) check it, or (a WAIT's) release the scripts sent before it."""

    __slots__ = ("future", "held", "outcome", "releases", "retry")

    def __init__(self, future: asyncio.Future[Any] | None, retry: tuple[str, Sequence[Any]] | None,
                 *, held: bool = False, releases: list[_Reply] | None = None) -> None:
        self.future = future
        self.retry = retry  # (script source, EVALSHA command) to resend after NOSCRIPT
        # Held: the reply (or error) waits in `outcome` for the WAIT sent after it.
        self.held = held
        self.outcome: Any = _UNSET
        self.releases = releases  # a WAIT's: the held slots its reply settles


def _pack(args: Sequence[Any]) -> bytes:
    # hiredis packs in C: about 2.5 us less than Python per log_once, and 0.5 us per record of a
    # coalesced delete. It refuses what Redis could not take (None, objects) with a TypeError.
    return hiredis.pack_command(tuple(args))


class _Protocol(asyncio.Protocol):
    def __init__(self, pipe: RespPipe) -> None:
        self.pipe = pipe
        self.transport: asyncio.Transport | None = None
        self.reader = hiredis.Reader()
        # Kept: asyncio.get_running_loop() makes a getpid system call on Python 3.11, and every call
        # of the pipe needs the loop.
        self.loop = asyncio.get_running_loop()
        self.lost: asyncio.Future[None] = self.loop.create_future()
        # When the connection last brought anything (loop clock): a call that times out with
        # nothing heard since it left finds the connection dead.
        self.heard_s = self.loop.time()
        # The timer that judges the connection once it may have been silent long enough (_judge).
        self.judging: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.heard_s = self.loop.time()
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            self.pipe.on_reply(self, reply)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        self.pipe.on_lost(self, exc)


class RespPipe:
    """A lazily connected, pipelined connection. `evalsha` is the only command callers use."""

    def __init__(self, address: RespAddress, timeout_ms_connect: int, replica_count: int = 0,
                 timeout_ms_replica_wait: int = 0, timeout_ms_silence: int | None = None) -> None:
        """`timeout_ms_silence`: how long a connection may answer nothing, with a request of it
        unanswered, before it is taken for dead (the owner's whole call timeout; by default
        `timeout_ms_connect`), whatever the deadlines of the calls waiting on it."""
        assert timeout_ms_connect > 0
        assert replica_count >= 0 and (timeout_ms_replica_wait > 0) == (replica_count > 0), (
            replica_count, timeout_ms_replica_wait)  # WAIT's timeout 0 would block forever
        timeout_ms_silence = timeout_ms_connect if timeout_ms_silence is None else timeout_ms_silence
        assert timeout_ms_silence > 0, timeout_ms_silence
        self.address = address
        self.timeout_ms_connect = timeout_ms_connect
        self.replica_count = replica_count
        self.timeout_ms_replica_wait = timeout_ms_replica_wait
        # Not a caller's deadline (found by audit, 2026-11-28, second): a call whose deadline its
        # caller cut short, or a batch bounded by its earliest caller's, waits on a server busy
        # for a moment (an fsync, a fork, a slow script), and dropping the connection then fails
        # every call on it. With replicas, more than a WAIT's timeout: Redis answers nothing
        # behind a waiting WAIT (found by review).
        self._silence_s = max(timeout_ms_silence, timeout_ms_replica_wait * WAIT_SILENCE_FACTOR) / 1000
        # Set by the owner before the first call: what each new connection must pass.
        self.connect_check: ConnectCheck | None = None
        # What a connect check refused the server with: every later call gets it.
        self._refusal: Exception | None = None
        # The scripts sent this tick: the WAIT the tick's write ends with releases them.
        self._unwaited: list[_Reply] = []
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Future[_Protocol] | None = None
        self._pending: collections.deque[_Reply] = collections.deque()
        self._outgoing: list[bytes] = []
        self._flush_scheduled = False
        self._closed = False
        self.call_count = 0
        self.write_count = 0  # socket writes: one per tick with calls in it
        self.wait_count = 0  # WAITs sent: one per tick with scripts in it, with replicas
        self.dropped_silent_count = 0  # connections dropped for silence (_judge)

    @property
    def connected(self) -> bool:
        """Whether a call made now goes out on a connection already set up (else it connects)."""
        return self._protocol is not None and self._connecting is None

    async def connect(self) -> None:
        """Connect now, where no connection is set up, within `timeout_ms_connect`: for an owner
        that must see the connect check's verdict before it packs its call (the store states a
        call's deadline in the clock the check measures)."""
        if not self.connected:
            await self._connect()

    async def evalsha(self, sha: str, source: str, keys: Sequence[str], args: Sequence[Any], timeout_s: float) -> Any:
        """The script's reply, or the error Redis answered (redis.exceptions.ResponseError), or
        redis.exceptions.ConnectionError when the connection broke first, or TimeoutError when
        no reply came within `timeout_s` of this call (connecting included)."""
        assert timeout_s > 0
        # Not on a connection still being set up: a call sent behind a SELECT that fails would run
        # in database 0 (found by review). Those wait for the setup, in _connect.
        protocol = self._protocol if self._connecting is None else None
        if protocol is None:
            loop = asyncio.get_running_loop()
            deadline_s = loop.time() + timeout_s
            protocol = await self._connect()
        else:
            loop = protocol.loop
            deadline_s = loop.time() + timeout_s
        command = ["EVALSHA", sha, len(keys), *keys, *args]
        future: asyncio.Future[Any] = loop.create_future()
        self._send(protocol, command, _Reply(future, (source, command), held=self.replica_count > 0))
        self.call_count += 1
        expiry = loop.call_at(deadline_s, self._expire, future, protocol, loop.time())
        try:
            return await future
        finally:
            expiry.cancel()

    def _send(self, protocol: _Protocol, command: Sequence[Any], reply: _Reply) -> None:
        if protocol is not self._protocol:
            raise redis.exceptions.ConnectionError("redis connection lost")
        if len(self._pending) >= PENDING_COUNT_MAX:
            raise redis.exceptions.ConnectionError(f"{PENDING_COUNT_MAX} redis calls unanswered")
        self._outgoing.append(_pack(command))
        self._pending.append(reply)
        if reply.held:
            self._unwaited.append(reply)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            protocol.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        protocol = self._protocol
        if protocol is None or protocol.transport is None or not self._outgoing:
            return
        if self._unwaited:
            # Bounded: within the pending count its scripts were admitted under, plus one.
            self._outgoing.append(_pack(("WAIT", self.replica_count, self.timeout_ms_replica_wait)))
            self._pending.append(_Reply(None, None, releases=self._unwaited))
            self._unwaited = []
            self.wait_count += 1
        protocol.transport.write(b"".join(self._outgoing))
        self._outgoing.clear()
        self.write_count += 1

    async def _connect(self) -> _Protocol:
        if self._closed:
            raise redis.exceptions.ConnectionError("store is closed")
        if self._refusal is not None:
            raise copy.copy(self._refusal)  # a copy: each raise would add to one traceback
        if self._connecting is not None:
            return await asyncio.shield(self._connecting)
        loop = asyncio.get_running_loop()
        self._connecting = loop.create_future()
        try:
            # In a task of its own, bounded by asyncio.wait: a caller may run outside any task
            # until it first waits (cornus.runtime.eager), where asyncio.timeout (and wait_for,
            # since Python 3.12: found by audit) refuse to run.
            opening = loop.create_task(self._open(loop))
            try:
                done, _ = await asyncio.wait((opening,), timeout=self.timeout_ms_connect / 1000)
            except asyncio.CancelledError:
                opening.cancel()
                raise
            if not done:
                opening.cancel()
                raise TimeoutError(f"no connection within {self.timeout_ms_connect} ms")
            protocol = opening.result()
            if self._closed:
                # Closed while it connected: close() saw no connection to close (found by audit,
                # 2026-11-28: this one stayed open for the process's life). Ended below.
                raise redis.exceptions.ConnectionError("store is closed")
        except BaseException as error:
            # A refused AUTH or SELECT too: the connection is not usable, whatever the reply. A
            # connect check's refusal goes to the callers as it is: it is no connection trouble.
            failure = (error if isinstance(error, redis.exceptions.ConnectionError) or error is self._refusal
                       else redis.exceptions.ConnectionError(f"redis connect: {type(error).__name__}: {error}"))
            half_open = self._protocol
            if half_open is not None:
                # Everything queued on the half-open connection (its AUTH and SELECT, and the
                # calls sent meanwhile) fails with it, here: left in the reply queue, those slots
                # would take the next connection's replies, each going to the caller before it.
                self.on_lost(half_open, failure)
                if half_open.transport is not None:
                    half_open.transport.abort()
            assert self._protocol is None and not self._pending
            self._connecting.set_exception(failure)
            self._connecting.exception()  # retrieved: nobody else may be waiting
            self._connecting = None
            if isinstance(error, asyncio.CancelledError):
                raise
            raise failure from error
        self._connecting.set_result(protocol)
        self._connecting = None
        return protocol

    async def _open(self, loop: asyncio.AbstractEventLoop) -> _Protocol:
        _, protocol = await loop.create_connection(lambda: _Protocol(self), self.address.host, self.address.port)
        self._protocol = protocol
        setup = []
        if self.address.password is not None:
            credentials = ([self.address.username] if self.address.username else []) + [self.address.password]
            setup.append(["AUTH", *credentials])
        if self.address.db:
            setup.append(["SELECT", self.address.db])
        check = self.connect_check
        checked = [] if check is None else list(check.commands())
        futures = []
        for command in [*setup, *checked]:
            future: asyncio.Future[Any] = loop.create_future()
            self._send(protocol, command, _Reply(future, None))
            futures.append(future)
        # All of them, so that no failure is left unretrieved behind the first.
        replies = await asyncio.gather(*futures, return_exceptions=True)
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        if check is not None:
            refusal = check.verdict(replies[len(setup):])
            if refusal is not None:
                self._refusal = refusal
                raise refusal
        return protocol

    def on_reply(self, protocol: _Protocol, reply: Any) -> None:
        if protocol is not self._protocol or not self._pending:
            return  # an old connection's, or a reply nobody asked for: never hand it to a caller
        slot = self._pending.popleft()
        if slot.releases is not None:
            self._release(slot.releases, reply)
            return
        future = slot.future
        if isinstance(reply, hiredis.ReplyError):
            message = str(reply)
            if message.startswith("NOSCRIPT") and slot.retry is not None and future is not None and not future.done():
                # The script did not run: load it, then send this call again (once).
                source, command = slot.retry
                load: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                # Its error, if any, reaches the caller through the resent call's own NOSCRIPT.
                load.add_done_callback(lambda done: done.cancelled() or done.exception())
                try:
                    self._send(protocol, ["SCRIPT", "LOAD", source], _Reply(load, None))
                    self._send(protocol, command, _Reply(future, None, held=slot.held))
                except redis.exceptions.ConnectionError as error:  # too many unanswered calls
                    self._settle(slot, error)
                    return
                slot.outcome = _RESENT  # the resent call settles the future, after its own WAIT
                return
            error: Exception
            if message.startswith("NOSCRIPT"):
                error = redis.exceptions.NoScriptError(message)
            elif not_serving(message):
                error = ServerNotServing(message)
            else:
                error = redis.exceptions.ResponseError(message)
            self._settle(slot, error)
            return
        self._settle(slot, reply)

    @staticmethod
    def _settle(slot: _Reply, outcome: Any) -> None:
        """Settle the slot's caller with `outcome` (a reply, or an exception to raise), or hold it
        for the WAIT sent after it."""
        if slot.held:
            slot.outcome = outcome
            return
        future = slot.future
        if future is None or future.done():
            return
        if isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    def _release(self, held: list[_Reply], reply: Any) -> None:
        """A WAIT's reply: the held scripts' outcomes go to their callers if enough replicas had
        them, else NotReplicated to each (the scripts ran; a failover may undo them)."""
        failure: Exception | None = None
        if isinstance(reply, hiredis.ReplyError):
            failure = NotReplicated(f"WAIT for replicas refused: {reply}")
        elif not isinstance(reply, int) or reply < self.replica_count:
            failure = NotReplicated.of(reply, self.replica_count, self.timeout_ms_replica_wait)
        for slot in held:
            assert slot.outcome is not _UNSET, "Redis answers in order: every script before its WAIT"
            if slot.outcome is _RESENT:
                continue
            slot.held = False
            self._settle(slot, slot.outcome if failure is None else failure)

    def _expire(self, future: asyncio.Future[Any], protocol: _Protocol, sent_s: float) -> None:
        if future.done():
            return
        # The reply, when it comes, is read and dropped in turn (on_reply skips settled futures).
        future.set_exception(TimeoutError())
        self._judge(protocol, sent_s)

    def _judge(self, protocol: _Protocol, sent_s: float) -> None:
        """Drop `protocol` if nothing came back on it for the silence allowed (`_silence_s`) since
        `sent_s`, when a request left on it that has not been answered; if that moment is still to
        come, judge it again then. Measured from the send, not from the connect: a call that
        connected first spent part of its deadline connecting (found by review: a fresh connection
        was dropped at once)."""
        if protocol is not self._protocol or protocol.heard_s >= sent_s:
            return
        silent_until_s = sent_s + self._silence_s
        if protocol.loop.time() < silent_until_s:
            # Judged then even if no call waits that long (every deadline cut short): a dead
            # connection would otherwise keep failing calls until the kernel gave up on it.
            if protocol.judging is None:
                protocol.judging = protocol.loop.call_at(silent_until_s, self._judge_again, protocol, sent_s)
            return
        # Not a byte since the request left, for a whole call timeout: Redis hung, or the address
        # went dark. Every call pending on it fails (each may or may not have run), and the next
        # call connects again.
        self.dropped_silent_count += 1
        self.on_lost(protocol, TimeoutError(f"nothing came back for {self._silence_s:.1f} s"))
        if protocol.transport is not None:
            protocol.transport.abort()

    def _judge_again(self, protocol: _Protocol, sent_s: float) -> None:
        protocol.judging = None
        self._judge(protocol, sent_s)

    def on_lost(self, protocol: _Protocol, exc: Exception | None) -> None:
        if protocol is not self._protocol:
            return
        self._protocol = None
        self._outgoing.clear()
        self._unwaited = []
        pending, self._pending = self._pending, collections.deque()
        for slot in pending:
            # A WAIT's held scripts were answered, but not released: they fail with it.
            for each in [slot, *(slot.releases or ())]:
                if each.future is not None and not each.future.done():
                    each.future.set_exception(redis.exceptions.ConnectionError(f"redis connection lost: {exc}"))

    async def close(self) -> None:
        self._closed = True
        protocol = self._protocol
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()
            try:
                async with asyncio.timeout(1):
                    await protocol.lost
            except TimeoutError:
                protocol.transport.abort()
