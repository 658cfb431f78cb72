"""The transactions a node coordinates for its clients: begin, operations routed to the partitions'
owners (the execution phase), commit through the core's coordinator machine, abort, and what the
caller is told. Every limit a transaction could outgrow, and the id a client chose, is checked before
it runs (admission.py).

One concern, kept in one file past 450 lines on purpose: the interactive path, the one-shot path
(`execute`, whose requests carry the prepares) and the idle sweep (which aborts a transaction whose
client went quiet and refreshes the executions of one still at work) all read and change a
transaction's whole state (CoordinatedTxn) and share its reply wait, its abort and its finish; a
split would only move those private steps behind an interface with a single user. What can stand
alone already does: the limits and the client id's checks (admission.py), the one-shot's redo
(admission.one_shot_redo), the idle rules (cornus.protocol.execution), the outcome types
(outcome.py)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from cornus.protocol import txn_ids
from cornus.protocol.config import Protocol
from cornus.protocol.effects import Decided, Reply
from cornus.protocol.events import CommitRequested, Event, ExecuteFailed
from cornus.protocol.execution import refresh_due, refresh_unanswered_ms
from cornus.protocol.owner_answer import in_doubt_for_a_client_id, refuses
from cornus.runtime import redo as redo_codec
from cornus.runtime.admission import check_client_txn, check_growth, one_shot_redo
from cornus.runtime.config import NodeConfig
from cornus.runtime.effect_runner import fatal
from cornus.runtime.failpoints import Failpoints
from cornus.runtime.keys import partition_of
from cornus.runtime.outcome import (
    AbortReason,
    ClientTxnBeginRefused,
    ClientTxnKnown,
    ClientTxnRefused,
    NodeOverloaded,
    Outcome,
    OutcomeStatus,
    TxnNotFound,
    TxnWrongState,
    may_have_run_outcome,
)
from cornus.runtime.timing import TimingLog, TxnTiming
from cornus.runtime.transport import PeerUnavailable, RequestTooLarge, Transport
from cornus.runtime.wire import (
    READ_VALUE_OVERHEAD_BYTES,
    ExecuteRequest,
    ExecuteResponse,
    ExecuteStatus,
    Op,
    OpKind,
    PeerResponse,
    validate_op,
)
from storage_adapters.contract import DATA_VALUE_BYTES_MAX, TxnState
from storage_adapters.errors import StorageUnavailable, ValidationError

log = logging.getLogger("cornus.node")

# Outcomes remembered for the status call after a transaction left memory.
OUTCOME_REMEMBERED_COUNT_MAX = 100_000
# Commits whose caller was told UNKNOWN, remembered apart (with their outcome once it comes): only
# a missed commit deadline puts one here, so ordinary traffic cannot push out the outcome of a
# commit whose caller was sent to the status call for it.
REPORTED_UNKNOWN_REMEMBERED_COUNT_MAX = 100_000
# Bytes of the writes of interactive transactions this node coordinates, held from their request
# to their end (the growth checks need them, and coordinator-log's record carries them): each
# transaction's are bounded by its redo records, but the open transactions only by
# txn_count_max, thousands. Past it a request is refused (NodeOverloaded, retryable) with nothing
# done. WRITE_HELD_ENTRY_BYTES is what Python spends around each key and value.
WRITES_HELD_BYTES_MAX = 256 * 1024 * 1024
WRITE_HELD_ENTRY_BYTES = 100
# A commit waits at most this long for its outcome before it reports UNKNOWN. It covers the vote
# timeout, a termination round or two and a decision write.
TIMEOUT_MS_COMMIT = 10_000
# What one one-shot may read over all its partitions (READ_BYTES_MAX counts it): its values come
# back in its reply, after its commit, so each partition is held to a share of it before it votes
# (`_read_shares`). Found by audit (2026-11-27): only what one partition answers was bounded
# (READ_BYTES_MAX), and a one-shot over 256 partitions could make its coordinator hold, and its
# reply carry, 2 GiB. As much as an interactive read's reply (services/api/rest.py
# READ_REPLY_VALUE_BYTES_MAX); each share is one value of the largest size at least, so over 256
# partitions the whole is 16.8 MB at most. Owners older than ExecuteRequest.read_bytes_max ignore
# the share.
ONE_SHOT_READ_BYTES_MAX = 16 * 1024 * 1024
# The errors the APIs answer as refusals that changed nothing (REST's 400, 404, 409 and 503, and
# gRPC's codes for them): none may reach a caller once a commit's prepare has left.
_REFUSALS = (ValidationError, TxnNotFound, TxnWrongState, NodeOverloaded, StorageUnavailable)

# An abort before commit tells a partition that did not answer it (or whose owner was moving or
# starting) again, from a task of its own, at most this many times, pausing DROP_PAUSE_MS_MIN, then
# twice as long each time: well within the owner's idle timeout, which ends the execution anyway.
DROP_RETRY_COUNT_MAX = 4
DROP_PAUSE_MS_MIN = 100
_DROP_TOLD_AGAIN = frozenset({ExecuteStatus.UNAVAILABLE, ExecuteStatus.NOT_READY, ExecuteStatus.NOT_OWNER})

_ABORT_REASONS = {
    ExecuteStatus.CONFLICT: AbortReason.CONFLICT,
    ExecuteStatus.CHECK_FAILED: AbortReason.CHECK_FAILED,
    ExecuteStatus.NOT_READY: AbortReason.NOT_READY,
    ExecuteStatus.UNAVAILABLE: AbortReason.PEER_UNAVAILABLE,
    ExecuteStatus.NOT_OWNER: AbortReason.PEER_UNAVAILABLE,
    ExecuteStatus.INVALID: AbortReason.CLIENT,
}


_WRITES = (OpKind.PUT, OpKind.DELETE)


# What the status call says of a transaction whose commit has not ended.
_UNDER_WAY = "in doubt: its commit is under way"


class TxnAborted(Exception):
    def __init__(self, outcome: Outcome, *, refused_as_invalid: bool = False) -> None:
        # ABORTED, or UNKNOWN where another process may have decided it (Coordination._abort_in_doubt).
        assert outcome.status in (OutcomeStatus.ABORTED, OutcomeStatus.UNKNOWN), outcome
        super().__init__(f"transaction {outcome.txn} {outcome.status}: {outcome.reason or ''} {outcome.detail}")
        self.outcome = outcome
        # An owner refused an operation as invalid input (ExecuteStatus.INVALID): the input is at
        # fault, so the same call fails again however often it runs (see `one_shot_outcome`).
        self.refused_as_invalid = refused_as_invalid


def one_shot_outcome(aborted: TxnAborted) -> Outcome:
    """The answer of a one-shot transaction that `aborted` ended: its outcome, or ValidationError
    when an owner refused its input as invalid.

    Why a refusal and not the outcome "aborted (client)": an aborted one-shot leaves nothing
    behind, neither a write nor a transaction to go on with, so an owner's "invalid" is to its
    caller what the coordinator's own check of the same input is (they differ only in where the
    limit was enforced, e.g. an owner whose op_count_max a rollout lowered): bad input that
    changed nothing. Both APIs answer that as bad input, REST 400 invalid_request and gRPC
    INVALID_ARGUMENT (the SDK's InvalidRequest), never as REST's 409, which is about the
    transaction's state (aborted, or wrong_state: gRPC's OUTCOME_ABORTED, FAILED_PRECONDITION).
    Found by review: REST answered 409 "client", gRPC INVALID_ARGUMENT. An interactive
    transaction's call differs, and keeps TxnAborted: refused by some owners after others ran it,
    it ended the transaction, which its caller must hear."""
    if aborted.refused_as_invalid:
        raise ValidationError(aborted.outcome.detail)
    return aborted.outcome


@dataclass(slots=True)
class CoordinatedTxn:
    txn: str
    protocol: Protocol
    timing: TxnTiming
    # partition -> its writes in order (empty dict: only read)
    touched: dict[str, dict[str, bytes | None]] = field(default_factory=dict)
    op_count: int = 0
    writes_held_bytes: int = 0  # its share of the node's WRITES_HELD_BYTES_MAX
    state: OutcomeStatus = OutcomeStatus.ACTIVE
    # A request carrying its prepare, or the machine's prepare, may have left: from here on no
    # refusal may reach the caller (Coordination._unknown_past_prepare).
    prepare_left: bool = False
    last_active_s: float = field(default_factory=time.monotonic)
    reply: asyncio.Future[Reply | None] | None = None  # None: no reply within TIMEOUT_MS_COMMIT
    reply_expiry: asyncio.TimerHandle | None = None
    # A reply that came after the commit deadline fired but before the commit resumed.
    late_reply: Reply | None = None
    busy: int = 0  # operations in flight; an idle sweep must not abort under them
    # partition -> monotonic ms at which the last request of ours that ran there (an operation or
    # a refresh) left: its owner's idle clock restarted later than that. A partition is out of it
    # while a refresh of it is out, so that no more than one is.
    requested_ms: dict[str, int] = field(default_factory=dict)
    # A partition whose owner refused a refresh: it dropped this transaction's execution, so the
    # commit cannot but abort; the next idle sweep aborts it now, to free its locks elsewhere.
    dropped_on: str | None = None
    # Why it may not commit any more, though it runs on (refuse_commit): a commit aborts it.
    commit_refused: str = ""


class Coordination:
    """`feed` hands an event to the node's core; `ready` says whether recovery has run."""

    def __init__(
        self,
        config: NodeConfig,
        transport: Transport,
        failpoints: Failpoints,
        timings: TimingLog,
        counters: collections.Counter[str],
        *,
        owner_of: Callable[[str], str | None],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self.owner_of = owner_of
        # Runs work nobody waits for, until the node stops (the effect runner's).
        self.spawn = spawn
        self.config = config
        self.node_id = config.node_id
        self.transport = transport
        self.failpoints = failpoints
        self.timings = timings
        self.counters = counters
        self.feed: Callable[[Event], None] = _unwired
        self.ready: Callable[[], bool] = lambda: False
        self.txns: dict[str, CoordinatedTxn] = {}
        self.writes_held_bytes = 0
        self.outcomes: collections.OrderedDict[str, Outcome] = collections.OrderedDict()
        # Commits whose caller was told UNKNOWN (no outcome within the deadline) and sent to the
        # status call, with the outcome their machine gives later (None until then).
        self._reported_unknown: collections.OrderedDict[str, Outcome | None] = collections.OrderedDict()
        # Called with (protocol, outcome) whenever a coordinated transaction ends: metrics hook in.
        self.outcome_observers: list[Callable[[str, Outcome], None]] = []
        self._txn_counter = 0
        # Set by a clean stop: the node delivers the decisions it has and begins nothing new.
        self.closing = False
        # Another process of this node took its identity (abandon_replies): it may run any
        # client-chosen id sent here, so no refusal of one says "nothing ran".
        self.deposed = False
        self.stop_aborts_running = 0  # abort_open's aborts not finished yet
        # Tells this life's transaction ids from a previous one's (the counter restarts at zero).
        self._incarnation = os.urandom(3).hex()
        # A client-chosen id must begin after this (txn_ids.client_begin_problem): this life knows
        # nothing of the ids an earlier one ran.
        self.started_unix_ms = int(time.time() * 1000)
        # When (wall clock) this process took the node's identity; None before
        # (txn_ids.client_begins_after_ms says why a client-chosen id must begin after it).
        self.identity_taken_unix_ms: Callable[[], int | None] = lambda: None
        # Whether this process may begin a client-chosen id now (txn_ids.identity_fresh_for_client_ids).
        self.identity_fresh: Callable[[], bool] = lambda: True
        # Whether the core's coordinator host runs a machine of the transaction (wired by the node).
        self.coordinates: Callable[[str], bool] = lambda txn: False

    # -- begin and operations ----------------------------------------------------------------------
    def begin(self, protocol: Protocol | None = None, client_txn: str | None = None) -> str:
        """Begin a transaction; its id, which this node makes unless the client chose it
        (`client_txn`, for a one-shot only: `_check_client_txn`). Raises ValidationError (a bad id,
        a protocol it does not name), TxnWrongState (an id this node has run) or NodeOverloaded,
        with nothing changed. A client-chosen id is checked before this node's load: a second
        delivery of a request the first ran must hear so, not a retryable "overloaded" (found by
        review: the SDK then ran it again under another id)."""
        if client_txn is not None and protocol is None:
            # The id names its protocol (txn_ids), which the request then need not repeat.
            protocol = txn_ids.protocol_of(client_txn) if isinstance(client_txn, str) else None
        protocol = protocol or self.config.protocol
        if not isinstance(protocol, Protocol):
            raise ValidationError(f"protocol must be one of {', '.join(p.value for p in Protocol)}, got {protocol!r}")
        checked = None if client_txn is None else self._check_client_txn(client_txn, protocol)
        if checked is not None and not self.identity_fresh():
            # It may have been deposed without knowing (found by audit, 2026-11-28): then the
            # later process may run this id, or have run it.
            raise ClientTxnRefused(f"{self.node_id} has not confirmed its identity lately (storage does not "
                                   "answer it): another process of the node may run this id", may_have_run=True)
        if self.closing:
            self._refuse_unserved(checked, f"{self.node_id} is stopping")
        if not self.ready():
            self._refuse_unserved(checked, f"{self.node_id} is still recovering")
        if len(self.txns) >= self.config.limits.txn_count_max:
            self._refuse_unserved(checked, f"{len(self.txns)} transactions in flight on {self.node_id}")
        if checked is None:
            self._txn_counter += 1
            txn = txn_ids.new_txn_id(int(time.time() * 1000), self.node_id, self._incarnation, self._txn_counter,
                                     protocol)
        else:
            txn = checked
        self.txns[txn] = CoordinatedTxn(txn, protocol, TxnTiming(protocol.value))
        return txn

    def _refuse_unserved(self, client_txn: str | None, why: str) -> NoReturn:
        """NodeOverloaded: nothing ran, and the caller may run it again under another id. Not for a
        client-chosen id an earlier process of this node may have run (txn_ids.
        predecessor_may_have_run): that is in doubt, and its caller must ask the status call
        (found by audit, 2026-11-28: a second delivery to a starting process heard 503, and the
        SDK ran a committed transfer again under a new id)."""
        if client_txn is not None and self._another_may_have_run(client_txn):
            raise ClientTxnRefused(f"{why}, and another process of {self.node_id} may have run it", may_have_run=True)
        raise NodeOverloaded(why)

    def _another_may_have_run(self, client_txn: str) -> bool:
        """txn_ids.another_process_may_have_run, of this process."""
        return txn_ids.another_process_may_have_run(txn_ids.begin_ms_of(client_txn), self.identity_taken_unix_ms(),
                                                    self.deposed or not self.identity_fresh(),
                                                    self.config.protocol_config)

    def begin_one_shot(self, protocol: Protocol | None = None, client_txn: str | None = None) -> str | Outcome:
        """`begin` for a one-shot, except that a client-chosen id an earlier delivery of the same
        request may have run is its UNKNOWN outcome (`may_have_run_outcome`), never a refusal
        that says nothing ran."""
        try:
            return self.begin(protocol, client_txn)
        except (ClientTxnRefused, ClientTxnKnown) as refused:
            if not refused.may_have_run:
                raise
            assert client_txn is not None
            return may_have_run_outcome(client_txn, refused)

    def _check_client_txn(self, txn: object, protocol: Protocol) -> str:
        """`txn` if this node may run a transaction under that client-chosen id with `protocol`."""
        # Memory first, then the id's checks: a resend of an id this life ran (an outcome is pushed
        # out only after OUTCOME_REMEMBERED_COUNT_MAX later ones) is "known", however old its
        # begin is by now (found by audit: refused as too old, "nothing ran", and the SDK sent
        # the committed transaction again under an id of the node's).
        # And the machines the core runs, which recovery rebuilds from the coordinator log with no
        # memory here (found by audit, 2026-11-28: a resend passing the begin checks, clocks more
        # than a slack apart, began the id again, and its commit crashed the node on the core's
        # "already coordinates").
        if isinstance(txn, str) and (self.known(txn) is not None or self.coordinates(txn)):
            raise ClientTxnKnown(f"transaction {txn} is already known to {self.node_id}: a client-chosen id names "
                                "one transaction, run once; ask its status")
        taken_ms = self.identity_taken_unix_ms()
        after_ms = txn_ids.client_begins_after_ms(self.started_unix_ms, taken_ms,
                                                  self.config.protocol_config.clock_slack_ms)
        try:
            return check_client_txn(
                txn, protocol, self.node_id, now_ms=int(time.time() * 1000), started_ms=after_ms,
                timeout_ms_peer_request=self.config.limits.timeout_ms_peer_request,
            )
        except ClientTxnBeginRefused as refused:
            # A begin ahead of this clock may be behind another's: another process of this node,
            # on a host whose clock runs ahead, may have run it (found by audit, 2026-11-28).
            if refused.may_have_run or not self._another_may_have_run(str(txn)):
                raise
            raise ClientTxnBeginRefused(str(refused), may_have_run=True) from None

    def active(self, txn: str) -> CoordinatedTxn:
        ctx = self.txns.get(txn)
        if ctx is None:
            if txn in self.outcomes:
                raise TxnWrongState(f"transaction {txn} already ended: {self.outcomes[txn].status}")
            if txn in self._reported_unknown:
                # Not "no such transaction": its caller may read that as "never ran" and run it
                # again (found by review).
                known = self._reported_unknown[txn]
                since = "not decided yet" if known is None else f"decided since: {known.status}"
                raise TxnWrongState(f"transaction {txn} already ended: its commit was answered unknown ({since}); "
                                    "ask its status")
            raise TxnNotFound(f"no transaction {txn} on {self.node_id}")
        if ctx.state is not OutcomeStatus.ACTIVE:
            raise TxnWrongState(f"transaction {txn} is {ctx.state}, not active")
        return ctx

    async def run_ops(self, txn: str, ops: Sequence[Op], read_bytes_max: int = 0) -> list[bytes | None]:
        """Run operations of an interactive transaction; the values of its GETs, in order. Raises
        TxnAborted (the transaction is then over: aborted, or in doubt for a client-chosen id that
        another process may have run) or ValidationError (nothing happened). `read_bytes_max` (0:
        none) bounds what they read in all, each partition held to its share (`_read_shares`)."""
        ctx = self.active(txn)
        if ctx.busy:
            # One call at a time, as commit: two of one transaction at a partition would share
            # its lock waits (found by review: one overwrote the other's, which was never woken),
            # and the order of their writes would be nobody's.
            raise TxnWrongState(f"transaction {txn} has operations running: one call at a time")
        by_partition, positions = self._group(ctx, ops)
        held_bytes = self._hold_writes(ctx, ops)
        # Named as touched before any request leaves (they leave from tasks of their own): an
        # abort that runs meanwhile must drop these partitions too.
        shares = _read_shares(by_partition, read_bytes_max)
        requests = [ExecuteRequest(txn, partition, self.node_id, tuple(group), continued=partition in ctx.touched,
                                   read_bytes_max=shares.get(partition, 0))
                    for partition, group in by_partition.items()]
        first_touched = [partition for partition in by_partition if partition not in ctx.touched]
        for partition in first_touched:
            ctx.touched[partition] = {}
        sent_ms = _monotonic_ms()
        ctx.busy += 1
        try:
            responses = await asyncio.gather(*(self._request_partition(request) for request in requests))
        finally:
            ctx.busy -= 1
            ctx.last_active_s = time.monotonic()
        if self.closing and ctx.state is OutcomeStatus.ACTIVE:
            # The stop's aborts (abort_open) skipped it while these ran. No commit of it can come
            # any more (the APIs are shut, or the node was deposed), so its executions and locks
            # elsewhere go now, not when their owners idle them out (found by audit, 2026-11-28).
            self.stop_aborts_running += 1
            try:
                outcome = await self._abort(ctx, AbortReason.PEER_UNAVAILABLE, f"{self.node_id} stopped")
            finally:
                self.stop_aborts_running -= 1
            raise TxnAborted(outcome)
        if ctx.state is not OutcomeStatus.ACTIVE:
            # Aborted (by its client, or idle) while the operations ran: what they read is not
            # the transaction's any more, and the abort dropped what they wrote.
            raise TxnWrongState(f"transaction {txn} was {ctx.state} while its operations ran")
        values = dict(zip(by_partition, responses, strict=True))
        failed = [(p, r) for p, r in values.items() if r.status is not ExecuteStatus.OK]
        if failed:
            response = _first_to_name([r for _, r in failed])
            if len(failed) == len(values) and all(r.status is ExecuteStatus.INVALID for _, r in failed):
                # Refused everywhere before anything ran (an owner's limits can differ from ours in
                # a rollout). Any other failure may have run (an answer lost): then only an abort
                # drops what it wrote (found by review: a write told "invalid" committed). A
                # partition this call touched first holds no execution of it, so the next request
                # there is a first one, not a continued one.
                for partition in first_touched:
                    ctx.touched.pop(partition, None)
                self._give_back_writes(ctx, held_bytes)
                raise ValidationError(response.detail)
            if txn_ids.is_client_chosen(txn) and any(in_doubt_for_a_client_id(r.status) for _, r in failed):
                # The core's rule: another process of this node may have run the id; the status
                # call reads the logs.
                raise TxnAborted(await self._abort_in_doubt(ctx, response.detail))
            raise TxnAborted(await self._abort_for(ctx, response),
                             refused_as_invalid=response.status is ExecuteStatus.INVALID)
        for partition in by_partition:
            ctx.requested_ms[partition] = sent_ms
        self._record_writes(ctx, by_partition)
        return [values[partition].values[index] for partition, index in positions]

    def _group(self, ctx: CoordinatedTxn, ops: Sequence[Op]) -> tuple[dict[str, list[Op]], list[tuple[str, int]]]:
        """The operations by partition, and where each GET's value will be: (partition, its index
        among that partition's GETs). Raises ValidationError, with nothing changed, for what could
        only fail later (at commit, and again on a retry)."""
        by_partition: dict[str, list[Op]] = {}
        positions: list[tuple[str, int]] = []
        gets_by_partition: dict[str, int] = {}
        partition_count = self.config.partition_count
        for op in ops:
            if not isinstance(op, Op) or not isinstance(op.kind, OpKind):
                raise ValidationError(f"not an operation: {op!r}")
            # Here, before any request leaves, not only at the owners: a bad operation changes
            # nothing (found by review: an owner's refusal beside a request that ran did), and the
            # other partitions of a one-shot vote as soon as their operations ran.
            validate_op(op)
            partition = partition_of(op.key, partition_count)
            group = by_partition.get(partition)
            if group is None:
                group = by_partition[partition] = []
            if op.kind is OpKind.GET:
                index = gets_by_partition.get(partition, 0)
                positions.append((partition, index))
                gets_by_partition[partition] = index + 1
            group.append(op)
        check_growth(ctx.protocol, self.config.limits, ctx.touched, ctx.op_count, by_partition)
        return by_partition, positions

    def _hold_writes(self, ctx: CoordinatedTxn, ops: Sequence[Op]) -> int:
        """Count the writes among `ops` against WRITES_HELD_BYTES_MAX now, before the requests
        wait (so that concurrent ones cannot all pass the check); NodeOverloaded, nothing held,
        if they do not fit. The transaction gives them back at its end."""
        held_bytes = sum(_held_bytes(op.key, op.value) for op in ops if op.kind in _WRITES)
        if self.writes_held_bytes + held_bytes > WRITES_HELD_BYTES_MAX:
            self.counters["requests_refused_writes_held"] += 1
            raise NodeOverloaded(
                f"{self.node_id} holds {self.writes_held_bytes} bytes of writes of open transactions, and these "
                f"{held_bytes} would pass the limit of {WRITES_HELD_BYTES_MAX}: commit or abort some, or retry later"
            )
        ctx.writes_held_bytes += held_bytes
        self.writes_held_bytes += held_bytes
        return held_bytes

    def _give_back_writes(self, ctx: CoordinatedTxn, held_bytes: int) -> None:
        assert 0 <= held_bytes <= ctx.writes_held_bytes <= self.writes_held_bytes, (held_bytes, ctx.writes_held_bytes)
        ctx.writes_held_bytes -= held_bytes
        self.writes_held_bytes -= held_bytes

    def _record_writes(self, ctx: CoordinatedTxn, by_partition: dict[str, list[Op]]) -> None:
        """Keep the writes `_hold_writes` counted; a key written again gives back what its
        earlier value took, so that the count stays what `touched` holds."""
        for partition, group in by_partition.items():
            ctx.op_count += len(group)
            writes = ctx.touched.setdefault(partition, {})
            for op in group:
                if op.kind is OpKind.PUT or op.kind is OpKind.DELETE:
                    if op.key in writes:
                        self._give_back_writes(ctx, _held_bytes(op.key, writes[op.key]))
                    writes[op.key] = op.value

    async def _request_partition(self, request: ExecuteRequest) -> ExecuteResponse:
        owner = self.owner_of(request.partition)
        if owner is None:
            # Nobody holds it as far as this node knows (a take or hand-over is under way).
            return ExecuteResponse(ExecuteStatus.NOT_OWNER, detail=f"no node holds {request.partition} now")
        try:
            response = await self.transport.request(owner, request, self.config.limits.timeout_ms_peer_request)
        except PeerUnavailable as error:
            return ExecuteResponse(ExecuteStatus.UNAVAILABLE, detail=f"owner of {request.partition}: {error}")
        except RequestTooLarge as error:
            return _too_large(request.partition, error)
        assert isinstance(response, ExecuteResponse)
        return _answer_checked(request, response)

    # -- abort -------------------------------------------------------------------------------------
    async def _abort_for(self, ctx: CoordinatedTxn, response: ExecuteResponse) -> Outcome:
        reason = _ABORT_REASONS.get(response.status, AbortReason.VOTED_NO)
        return await self._abort(ctx, reason, response.detail)

    async def _abort(self, ctx: CoordinatedTxn, reason: AbortReason, detail: str) -> Outcome:
        """Abort before commit: no participant voted, so telling them to drop state is enough."""
        ctx.state = OutcomeStatus.ABORTED
        await asyncio.gather(*(self._drop_on(ctx.txn, partition) for partition in ctx.touched), return_exceptions=True)
        outcome = Outcome(ctx.txn, OutcomeStatus.ABORTED, reason, detail)
        self._finish(ctx, outcome)
        return outcome

    async def _abort_in_doubt(self, ctx: CoordinatedTxn, detail: str) -> Outcome:
        """End a transaction of this process before its commit, whose outcome another process may
        have decided (`run_ops`): its own executions go, and its caller hears UNKNOWN, as the
        status call does from this node."""
        ctx.state = OutcomeStatus.ABORTED
        await asyncio.gather(*(self._drop_on(ctx.txn, partition) for partition in ctx.touched), return_exceptions=True)
        return self._unknown(ctx, f"another process may have run this id: {detail}; ask status")

    async def _drop_on(self, txn: str, partition: str) -> None:
        """Tell `partition` to drop `txn`'s execution (its caller waits for this first telling, so
        a retry of the transaction does not meet its locks), and, where it was not heard, again
        later (`_drop_again`). Found by audit (2026-11-28): told once, a request lost on the way
        left the execution and its locks until the owner idled it out, 30 s."""
        if not await self._told_to_drop(txn, partition):
            self.spawn(self._drop_again(txn, partition))

    async def _told_to_drop(self, txn: str, partition: str) -> bool:
        response = await self._request_partition(ExecuteRequest(txn, partition, self.node_id, (), abort=True))
        return response.status not in _DROP_TOLD_AGAIN

    async def _drop_again(self, txn: str, partition: str) -> None:
        pause_ms = DROP_PAUSE_MS_MIN
        for _ in range(DROP_RETRY_COUNT_MAX):
            await asyncio.sleep(pause_ms / 1000)
            if await self._told_to_drop(txn, partition):
                return
            pause_ms *= 2
        # The owner's idle timeout ends it.
        self.counters["aborts_not_heard"] += 1

    async def abort(self, txn: str, *, input_refused: bool = False) -> Outcome:
        """Abort an active transaction. `input_refused`: its caller's request was refused before any
        of it ran (bad input, or no room for its writes: a one-shot run as begin, run_ops and
        commit, as the public gRPC API does), so a client-chosen id of it stays free for the
        corrected request or the retry, as `execute` leaves it."""
        ctx = self.active(txn)
        outcome = await self._abort(ctx, AbortReason.CLIENT, "aborted by the caller")
        if input_refused:
            self._forget_refused(ctx, txn if txn_ids.is_client_chosen(txn) else None)
        return outcome

    def refuse_commit(self, txn: str, reason: str) -> None:
        """From now on a commit of `txn` aborts it, for `reason`: its caller was told that an
        operation of it changed nothing, which still runs (a gRPC Write past its deadline, whose
        end aborts it). Set in the step the caller is told, so no commit can slip in before that
        abort starts (found by audit: one did, a loop step after the write ended). Nothing to do
        for a transaction that is over."""
        ctx = self.txns.get(txn)
        if ctx is not None and ctx.state is OutcomeStatus.ACTIVE:
            ctx.commit_refused = reason

    # -- commit ------------------------------------------------------------------------------------
    async def commit(self, txn: str) -> Outcome:
        ctx = self.active(txn)
        if self.closing:
            # A clean stop waits only for the decisions of commits already under way. Refused,
            # the transaction is over: its executions and locks go now, not at the idle sweep,
            # and its caller hears that it aborted, retryable; not a refusal that changed nothing
            # (found by audit, 2026-11-28: a 503 "retry", whose retry heard "already aborted").
            return await self._abort(ctx, AbortReason.PEER_UNAVAILABLE, f"{self.node_id} is stopping")
        if ctx.busy:
            raise TxnWrongState(f"transaction {txn} still has operations running")
        if ctx.commit_refused:
            return await self._abort(ctx, AbortReason.CLIENT, ctx.commit_refused)
        ctx.timing.commit_requested = time.perf_counter()
        writes = tuple((p, redo_codec.encode(w)) for p, w in sorted(ctx.touched.items()) if w)
        reads = tuple(sorted(p for p, w in ctx.touched.items() if not w))
        # The machine confirms (and releases) the partitions only read, then runs the protocol.
        self.failpoints.hit("coordinator.before_prepare")
        try:
            self._request_commit(ctx, CommitRequested(self.node_id, txn, writes, reads))
            if writes:
                self.failpoints.hit("coordinator.after_prepare")
            reply = await self._await_reply(ctx)
        except _REFUSALS as error:
            return self._unknown_past_prepare(ctx, error)
        if reply is None:
            return self._unknown(ctx)
        if reply.outcome is TxnState.COMMIT:
            return self._finish(ctx, Outcome(txn, OutcomeStatus.COMMITTED))
        return self._finish(ctx, Outcome(txn, OutcomeStatus.ABORTED, AbortReason.VOTED_NO, reply.reason))

    def _request_commit(self, ctx: CoordinatedTxn, request: CommitRequested) -> None:
        ctx.state = OutcomeStatus.UNKNOWN  # until the machine replies
        ctx.prepare_left = True
        ctx.timing.participant_count = len(request.writes)
        loop = asyncio.get_running_loop()
        ctx.reply = loop.create_future()
        # A bare timer, not asyncio.timeout around the wait (a context, a task lookup and a
        # reschedule per commit): the same bound for a fraction of the CPU.
        ctx.reply_expiry = loop.call_later(TIMEOUT_MS_COMMIT / 1000, _no_reply, ctx.reply)
        self.feed(request)

    async def _await_reply(self, ctx: CoordinatedTxn) -> Reply | None:
        """The machine's reply, or None if none came within the commit deadline."""
        assert ctx.reply is not None and ctx.reply_expiry is not None
        try:
            return await ctx.reply
        finally:
            ctx.reply_expiry.cancel()  # or thousands of spent timers would wait out their 10 s

    def abandon_replies(self) -> None:
        """The node stops deciding (deposed): every commit waiting for its machine's reply is told
        UNKNOWN now, not at its deadline (the other process of this node, or a participant's
        termination, decides it; the status call finds the outcome from the records)."""
        self.closing = True
        self.deposed = True
        for ctx in self.txns.values():
            if ctx.reply is not None:
                _no_reply(ctx.reply)

    def _unknown_past_prepare(self, ctx: CoordinatedTxn, error: Exception) -> Outcome:
        """A refusal raised once the commit's prepare has left: the transaction may commit, so its
        caller must not hear "nothing changed" (a 503 the SDK retries under a new id, running a
        committed transfer twice) but UNKNOWN, and ask the status call. No path raises one today;
        this keeps a later change from doing it silently."""
        log.error("%s raised after the prepare of %s left; reported UNKNOWN: %r", type(error).__name__, ctx.txn,
                  error, extra={"txn": ctx.txn})
        self.counters["refusals_past_prepare"] += 1
        if ctx.reply_expiry is not None:
            ctx.reply_expiry.cancel()
        return self._unknown(ctx, f"the commit may go on ({type(error).__name__}); ask status")

    def _unknown(self, ctx: CoordinatedTxn,
                 detail: str = "no outcome within the commit deadline; ask status") -> Outcome:
        outcome = Outcome(ctx.txn, OutcomeStatus.UNKNOWN, detail=detail)
        self._finish(ctx, outcome, remember=False)
        late = ctx.late_reply
        self._reported_unknown[ctx.txn] = None if late is None else _outcome_of(late)
        while len(self._reported_unknown) > REPORTED_UNKNOWN_REMEMBERED_COUNT_MAX:
            self._reported_unknown.popitem(last=False)
        return outcome

    def on_reply(self, effect: Reply) -> None:
        ctx = self.txns.get(effect.txn)
        if ctx is None:
            if effect.txn in self._reported_unknown and self._reported_unknown[effect.txn] is None:
                # Its caller was sent to the status call, which must find this outcome after the
                # machine and the records are gone, as it finds any other.
                self._reported_unknown[effect.txn] = _outcome_of(effect)
            return
        if ctx.reply is None:
            return  # no commit waits (an abort's reply)
        if ctx.reply.done():
            # The deadline fired in this very tick, and the commit has not resumed yet to report
            # UNKNOWN: the outcome is kept for the status call it will send its caller to.
            ctx.late_reply = effect
            return
        if not ctx.timing.decided:
            ctx.timing.decided = time.perf_counter()
        ctx.reply.set_result(effect)

    def on_decided(self, effect: Decided) -> None:
        ctx = self.txns.get(effect.txn)
        if ctx is not None and not ctx.timing.decided:
            ctx.timing.decided = time.perf_counter()  # the votes are in: prepare ends here

    def _finish(self, ctx: CoordinatedTxn, outcome: Outcome, remember: bool = True) -> Outcome:
        ctx.state = outcome.status
        ctx.timing.replied = time.perf_counter()
        if ctx.timing.commit_requested:
            phases = self.timings.record(ctx.timing)
            outcome = Outcome(outcome.txn, outcome.status, outcome.reason, outcome.detail, outcome.reads, phases)
        if self.txns.pop(ctx.txn, None) is not None:
            self._give_back_writes(ctx, ctx.writes_held_bytes)
        if remember:
            self._remember(outcome)
        self.counters[f"outcome_{outcome.status}"] += 1
        if outcome.reason is not None:
            self.counters[f"abort_{outcome.reason}"] += 1
        for observer in self.outcome_observers:
            observer(ctx.protocol.value, outcome)
        return outcome

    def _remember(self, outcome: Outcome) -> None:
        self.outcomes[outcome.txn] = outcome
        while len(self.outcomes) > OUTCOME_REMEMBERED_COUNT_MAX:
            self.outcomes.popitem(last=False)

    async def execute(self, ops: Sequence[Op], protocol: Protocol | None = None,
                      client_txn: str | None = None) -> Outcome:
        """A one-shot transaction. When it writes anywhere, each partition's request carries its
        prepare too (one message and one round trip fewer per partition), and a partition it only
        reads votes like the others (paper 3.5: in parallel with them, so no write more on the
        critical path), instead of confirming its read locks in a round trip of its own before
        anyone may vote. A wholly read-only one runs its requests, then commits without either
        phase. Bad input raises ValidationError, whether this node or an owner refused it, and
        changes nothing (`one_shot_outcome`). `client_txn`: the id the client chose (`begin`); one
        an earlier delivery of the same request may have run is UNKNOWN (`may_have_run_outcome`)."""
        txn = self.begin_one_shot(protocol, client_txn)
        if isinstance(txn, Outcome):
            return txn
        ctx = self.txns[txn]
        try:
            by_partition, positions = self._group(ctx, ops)
            writes_somewhere = any(op.kind in _WRITES for op in ops)
            redo_by_partition = one_shot_redo(ctx.protocol, by_partition) if writes_somewhere else None
            if redo_by_partition is not None:
                self._hold_writes(ctx, ops)  # run_ops holds them on the other path
        except (ValidationError, NodeOverloaded) as refused:
            in_doubt = await self._refuse_one_shot(ctx, client_txn, refused)
            if in_doubt is not None:
                return in_doubt
            raise
        gets = [op.key for op in ops if op.kind is OpKind.GET]
        if redo_by_partition is not None:
            try:
                outcome, values = await self._execute_prepared(ctx, by_partition, redo_by_partition, positions)
            except TxnAborted as aborted:
                return one_shot_outcome(aborted)
            except _REFUSALS as error:
                if not ctx.prepare_left:
                    await self._refuse_one_shot(ctx, client_txn, error)  # nothing changed indeed
                    raise
                return self._unknown_past_prepare(ctx, error)
        else:
            try:
                values = await self.run_ops(txn, ops, ONE_SHOT_READ_BYTES_MAX)
            except TxnAborted as aborted:
                return one_shot_outcome(aborted)
            except (ValidationError, NodeOverloaded) as refused:
                # As above (found by review: a refusal here left a client-chosen id taken, and a
                # NodeOverloaded left the transaction open, holding its slot, until the idle sweep).
                in_doubt = await self._refuse_one_shot(ctx, client_txn, refused)
                if in_doubt is not None:
                    return in_doubt
                raise
            outcome = await self.commit(txn)
        reads = tuple(zip(gets, values, strict=True)) if outcome.status is OutcomeStatus.COMMITTED else ()
        return Outcome(outcome.txn, outcome.status, outcome.reason, outcome.detail, reads, outcome.timing_ms)

    async def _refuse_one_shot(self, ctx: CoordinatedTxn, client_txn: str | None,
                               refused: ValidationError | NodeOverloaded) -> Outcome | None:
        """End a one-shot refused with nothing run here (bad input, or no room for its writes): None,
        and the refusal stands. Its UNKNOWN outcome instead where it is no room, for a client-chosen
        id that another process of this node may have run (`_unserved_in_doubt`)."""
        if isinstance(refused, NodeOverloaded):
            in_doubt = await self._unserved_in_doubt(ctx, client_txn, refused)
            if in_doubt is not None:
                return in_doubt
            await self._abort(ctx, AbortReason.PEER_UNAVAILABLE, "node overloaded")
        else:
            await self._abort(ctx, AbortReason.CLIENT, "invalid request")
        self._forget_refused(ctx, client_txn)
        return None

    async def refuse_one_shot(self, txn: str, client_txn: str | None, refused: ValidationError | NodeOverloaded,
                              ) -> Outcome | None:
        """`_refuse_one_shot` for a one-shot run as begin, run_ops and commit (the public gRPC API)."""
        return await self._refuse_one_shot(self.active(txn), client_txn, refused)

    async def _unserved_in_doubt(self, ctx: CoordinatedTxn, client_txn: str | None,
                                 refused: NodeOverloaded) -> Outcome | None:
        """A one-shot under `client_txn` that this process refused for its load after it began
        (`refused`), as begin does (`_refuse_unserved`): in doubt while another process of this node
        may have run it, so its caller hears UNKNOWN, and the id stays known here, so a later
        delivery hears so too. None if it was not (nothing is done then). Found by audit
        (2026-11-28, second): the refusal for the writes held said "nothing ran", a 503."""
        if client_txn is None or not self._another_may_have_run(client_txn):
            return None
        return await self._abort_in_doubt(ctx, str(refused))

    def _forget_refused(self, ctx: CoordinatedTxn, client_txn: str | None) -> None:
        """A one-shot refused before any request left this node changed nothing, and the caller was
        told so: a client-chosen id of it stays free for the corrected request (as the status call,
        finding nothing, says it never committed), not "already known"."""
        if client_txn is not None and not ctx.touched:
            self.outcomes.pop(ctx.txn, None)

    async def _execute_prepared(
        self,
        ctx: CoordinatedTxn,
        by_partition: dict[str, list[Op]],
        redo_by_partition: dict[str, bytes],
        positions: list[tuple[str, int]],
    ) -> tuple[Outcome, list[bytes | None]]:
        """Every partition is a participant: its operations and its prepare go in one request, and
        the commit request goes to the machine at the same moment (CommitRequested.prepare_sent).
        A failed request is reported to the machine, which decides; the caller hears the machine."""
        self._record_writes(ctx, by_partition)
        writes = tuple(sorted(redo_by_partition.items()))
        participants = tuple(p for p, _ in writes)
        # Counted from the begin the id carries, which the status call knows (status.py): past it
        # no owner runs these requests, so none of them can vote yes after "not known" was said.
        deadline_unix_ms = txn_ids.begin_ms_of(ctx.txn) + self.config.limits.timeout_ms_peer_request
        # Its values arrive as it commits: each partition is held to its share of what a reply
        # carries, which its owner refuses past before it votes.
        shares = _read_shares(by_partition, ONE_SHOT_READ_BYTES_MAX)
        requests = [ExecuteRequest(ctx.txn, p, self.node_id, tuple(group), participants=participants,
                                   deadline_unix_ms=deadline_unix_ms, read_bytes_max=shares.get(p, 0))
                    for p, group in by_partition.items()]
        answers: dict[str, tuple[ExecuteResponse, bool]] = {}  # partition -> (response, refused), as they come
        all_answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Failures known before the machine exists (no owner, a link down), heard once it does.
        failed_at_once: list[tuple[str, ExecuteResponse, bool]] | None = []

        def answered(partition: str, response: ExecuteResponse, refused: bool) -> None:
            if failed_at_once is not None:
                failed_at_once.append((partition, response, refused))
                return
            answers[partition] = (response, refused)
            if response.status is not ExecuteStatus.OK:
                # The machine hears of it at once: a refusal decides without the others' answers.
                self.feed(ExecuteFailed(self.node_id, ctx.txn, partition, refused, response.detail))
            if len(answers) == len(requests):
                # The execution phase, as the caller sees it, ends with the last answer; the
                # prepare overlapped it, and what is left of it is measured from here.
                ctx.timing.commit_requested = time.perf_counter()
                all_answered.set_result(None)

        self.failpoints.hit("coordinator.before_prepare")
        # Queued, each without a task of its own, then sent together at once: the remote ones
        # are the longer round trips, and at the end of the tick they would leave behind every
        # callback queued before them (other transactions' work, under load). They leave before
        # the machine is fed, whose step would otherwise sit on every request's round trip: no
        # answer or vote can reach this node within this step (a peer's comes through a socket,
        # this node's own request runs on a later tick), so the machine exists before any does.
        ctx.prepare_left = True
        for request in requests:
            self._start_prepared(request, answered)
        self.transport.flush()
        self._request_commit(ctx, CommitRequested(self.node_id, ctx.txn, writes, (), prepare_sent=True))
        early, failed_at_once = failed_at_once, None
        assert early is not None
        for failure in early:
            answered(*failure)
        self.failpoints.hit("coordinator.after_prepare")
        reply = await self._await_reply(ctx)
        if not ctx.timing.commit_requested:
            ctx.timing.commit_requested = time.perf_counter()  # decided before every answer came
        if reply is None:
            return self._unknown(ctx), []
        if reply.outcome is TxnState.ABORT:
            # Not waiting for the other answers: the participants that ran learn ABORT from the
            # machine, and a request still on its way is refused where the ABORT overtook it.
            # Among the answers already in.
            refusals = [r for r, refused in answers.values() if refused and r.status is not ExecuteStatus.OK]
            refusal = _first_to_name(refusals) if refusals else None
            if refusal is not None:
                reason = _ABORT_REASONS.get(refusal.status, AbortReason.VOTED_NO)
                aborted = self._finish(ctx, Outcome(ctx.txn, OutcomeStatus.ABORTED, reason, refusal.detail))
                if refusal.status is ExecuteStatus.INVALID:
                    raise TxnAborted(aborted, refused_as_invalid=True)
                return aborted, []
            return self._finish(ctx, Outcome(ctx.txn, OutcomeStatus.ABORTED, AbortReason.VOTED_NO, reply.reason)), []
        # Committed: finished now, before the wait for the answers below, so that a caller
        # cancelled within it (a REST request cut by the server's shutdown) leaves the outcome
        # remembered and the writes' bytes given back, not an entry UNKNOWN for the process's life
        # (found by audit, 2026-11-28).
        committed = self._finish(ctx, Outcome(ctx.txn, OutcomeStatus.COMMITTED))
        # Every participant voted yes, so every request ran; its answer left before its vote. Or,
        # for an id the client chose, a request of another process of this node ran there and
        # voted, and ours was refused (CornusCoordinator._on_execution_failed): its values are
        # lost below.
        if not all_answered.done():
            # Bounded: every request has that deadline, by which its future settles; one that is
            # cancelled instead (the transport closing) is never answered, and counts as lost.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.limits.timeout_ms_peer_request / 1000):
                    await asyncio.shield(all_answered)
        contradicting = [p for p, (r, refused) in answers.items() if refused and r.status is not ExecuteStatus.OK]
        if contradicting and not txn_ids.is_client_chosen(ctx.txn):
            # An owner refused a request whose vote is in its log: a peer's bug (another version
            # in a rollout). Said loudly, not raised: raised here, after the commit, the caller
            # heard an error for a committed transaction, which stayed unfinished (found by review).
            self.counters["owner_answers_contradicting_votes"] += 1
            log.error("%s committed although %s refused it: %s", ctx.txn, ", ".join(sorted(contradicting)),
                      {p: answers[p][0].detail for p in contradicting}, extra={"txn": ctx.txn})
        lost = sorted(p for p in by_partition if p not in answers or answers[p][0].status is not ExecuteStatus.OK)
        if lost:
            # Committed (every participant's log holds its yes vote, and the status call says
            # so) but an owner's answer, and what was read there, was lost: the caller is sent
            # to the status call rather than handed values nobody read.
            detail = f"committed, but the values read on {', '.join(lost)} were lost with the owners' answers"
            return Outcome(ctx.txn, OutcomeStatus.UNKNOWN, detail=detail, timing_ms=committed.timing_ms), []
        return committed, [answers[partition][0].values[index] for partition, index in positions]

    def _start_prepared(self, request: ExecuteRequest, answered: Callable[[str, ExecuteResponse, bool], None]) -> None:
        """Send `request`; `answered` gets the owner's answer, and whether a failure was the
        owner's refusal (it did not run the request, so it will never vote) rather than no answer
        (it may have voted). A node that stops with the request unanswered calls nothing."""
        partition = request.partition
        owner = self.owner_of(partition)
        if owner is None:
            answered(partition, ExecuteResponse(ExecuteStatus.NOT_OWNER, detail=f"no node holds {partition} now"), True)
            return
        try:
            future = self.transport.start_request(owner, request, self.config.limits.timeout_ms_peer_request)
        except PeerUnavailable as error:
            answered(partition, ExecuteResponse(ExecuteStatus.UNAVAILABLE, detail=f"owner of {partition}: {error}"),
                     False)
            return

        def done(future: asyncio.Future[PeerResponse]) -> None:
            if future.cancelled():
                return  # the event loop is stopping: the process is ending
            error = future.exception()
            if error is None:
                raw = future.result()
                assert isinstance(raw, ExecuteResponse)
                # The core's rule (ABORTED is none: the owner's vote may stand), on what the owner
                # said: a malformed OK, taken for an answer lost, is no refusal either, since the
                # owner ran the request and voted (found by review, 2026-11-28: its UNAVAILABLE
                # read as a refusal, and a Cornus coordinator aborted beside a yes vote in every
                # log). The blocking protocols abort either way; there an earlier process's COMMIT
                # is a write to this node's coordinator log, which the identity fence refuses once
                # a later process took the node's name.
                answered(partition, _answer_checked(request, raw), refuses(raw.status))
            elif isinstance(error, PeerUnavailable):
                answered(partition, ExecuteResponse(ExecuteStatus.UNAVAILABLE, detail=f"owner of {partition}: {error}"),
                         False)
            elif isinstance(error, RequestTooLarge):
                answered(partition, _too_large(partition, error), True)  # never sent: the owner holds no vote
            else:
                # A one-shot's requests outlive its caller when it aborts early: a failure of
                # theirs (a bug, since request failures are answers) must still be heard.
                fatal(f"a one-shot's request failed: {error!r}")

        future.add_done_callback(done)

    # -- what this node knows, and housekeeping ------------------------------------------------------
    def known(self, txn: str) -> Outcome | None:
        """What this node knows of a transaction it coordinates or coordinated (None: nothing)."""
        ctx = self.txns.get(txn)
        if ctx is not None:
            return Outcome(txn, OutcomeStatus.ACTIVE if ctx.state is OutcomeStatus.ACTIVE else OutcomeStatus.UNKNOWN)
        known = self.outcomes.get(txn)
        if known is not None:
            return known
        if txn in self._reported_unknown:
            # Told UNKNOWN and not decided since: in doubt, never "nothing" (found by review: read
            # as nothing, with its votes still on their way, the status call said "no such
            # transaction", and the caller ran it again).
            return self._reported_unknown[txn] or Outcome(txn, OutcomeStatus.UNKNOWN, detail=_UNDER_WAY)
        return None

    def sweep_idle(self) -> None:
        """Abort transactions idle past timeout_ms_txn_idle (their clients are gone), and refresh
        the executions the others hold on partitions their requests last reached long ago."""
        now = time.monotonic()
        now_ms = int(now * 1000)
        idle_ms = self.config.limits.timeout_ms_txn_idle
        idle_s = idle_ms / 1000
        for ctx in list(self.txns.values()):
            if ctx.state is not OutcomeStatus.ACTIVE:
                continue  # committing (its machine holds the executions now) or over
            if ctx.busy:
                pass  # an operation in flight: the sweep after it ends decides
            elif ctx.prepare_left:
                if now - ctx.last_active_s > idle_s:
                    # Its prepares may have left (something raised between them and its commit):
                    # termination may commit it, so it is in doubt, never aborted without the
                    # logs (found by audit, 2026-11-28); the status call reads them.
                    self._unknown(ctx, "its prepare may have left before its commit failed; ask status")
                continue
            elif ctx.dropped_on is not None or now - ctx.last_active_s > idle_s:
                # Decided now, not when the abort's task first runs: a commit or operation that
                # runs in between must find the transaction over, or its prepares would go out
                # while the abort drops the executions that vote on them.
                ctx.state = OutcomeStatus.ABORTED
                if ctx.dropped_on is not None:
                    detail = f"the owner of {ctx.dropped_on} dropped its execution"
                    self.spawn(self._abort(ctx, AbortReason.VOTED_NO, detail))
                else:
                    self.spawn(self._abort(ctx, AbortReason.TIMEOUT, "idle past timeout_ms_txn_idle"))
                continue
            if ctx.requested_ms:
                for partition in refresh_due(ctx.requested_ms, now_ms, idle_ms):
                    previous_ms = ctx.requested_ms.pop(partition)
                    self.counters["executions_refreshed"] += 1
                    self.spawn(self._refresh(ctx, partition, previous_ms, now_ms))

    def abort_open(self) -> int:
        """The node stops (its APIs are shut, so no client reaches these any more): abort every
        interactive transaction still open here, so that their executions, and their locks, on
        other nodes' partitions go now (found by audit, 2026-11-28: they stayed until those owners
        idled them out, a minute by default, on every rolling restart). Not one whose prepare may
        have left, nor yet one with operations running (`run_ops` aborts it once they end); how
        many it aborts (`stop_aborts_running` says how many of those are still telling their
        partitions)."""
        count = 0
        for ctx in list(self.txns.values()):
            if ctx.state is OutcomeStatus.ACTIVE and not ctx.busy and not ctx.prepare_left:
                ctx.state = OutcomeStatus.ABORTED  # as the idle sweep: decided before the task runs
                self.stop_aborts_running += 1
                self.spawn(self._abort_at_stop(ctx))
                count += 1
        return count

    async def _abort_at_stop(self, ctx: CoordinatedTxn) -> None:
        try:
            await self._abort(ctx, AbortReason.PEER_UNAVAILABLE, f"{self.node_id} stopped")
        finally:
            self.stop_aborts_running -= 1

    async def _refresh(self, ctx: CoordinatedTxn, partition: str, previous_ms: int, sent_ms: int) -> None:
        """Restart the owner's idle clock of the execution `ctx` holds on `partition` with an
        empty continued request: its client is at work, if elsewhere. A refresh never starts an
        execution, so one the owner dropped stays dropped, and the commit's prepare finds it gone."""
        request = ExecuteRequest(ctx.txn, partition, self.node_id, (), continued=True)
        response = await self._request_partition(request)
        if response.status is ExecuteStatus.ABORTED:
            # Gone there (idled out before, or its owner restarted) and now refused for good: that
            # partition would vote no at the commit. Nothing left to refresh; the next sweep aborts
            # (not this task: an operation may be in flight, and the sweep knows when none is).
            self.counters["executions_refresh_refused"] += 1
            ctx.dropped_on = partition
            return
        # Refreshed, or perhaps not (no answer in time, the partition moving): then due again a
        # retry later, with most of a refresh's margin still ahead of the owner's drop.
        idle_ms = self.config.limits.timeout_ms_txn_idle
        refreshed_ms = (sent_ms if response.status is ExecuteStatus.OK
                        else refresh_unanswered_ms(previous_ms, sent_ms, idle_ms))
        # An operation that ran there meanwhile put its own, later, time.
        ctx.requested_ms[partition] = max(refreshed_ms, ctx.requested_ms.get(partition, refreshed_ms))


def _read_shares(by_partition: Mapping[str, Sequence[Op]], read_bytes_max: int) -> dict[str, int]:
    """Each reading partition's even share of `read_bytes_max` (none when it is 0, or when one
    partition reads: READ_BYTES_MAX holds it then). An even share rather than a fit: what each
    will read is known only where it is read, and every owner must refuse before it votes."""
    reading = [partition for partition, ops in by_partition.items() if any(op.kind is OpKind.GET for op in ops)]
    if not read_bytes_max or len(reading) < 2:
        return {}
    # One value of the largest size always fits (found by review: over 256 partitions the share
    # was under one, and a one-shot reading a single large value there was refused).
    return dict.fromkeys(reading, max(DATA_VALUE_BYTES_MAX + READ_VALUE_OVERHEAD_BYTES,
                                      read_bytes_max // len(reading)))


def _answer_checked(request: ExecuteRequest, response: ExecuteResponse) -> ExecuteResponse:
    """`response`, unless it says OK without a value for each GET of `request`: then an answer
    lost (the owner may have run it, and voted). Found by audit (2026-11-27): the values were
    indexed by the reads, and too few raised after a one-shot had committed."""
    if response.status is ExecuteStatus.OK:
        read_count = sum(op.kind is OpKind.GET for op in request.ops)
        if len(response.values) != read_count:
            return ExecuteResponse(ExecuteStatus.UNAVAILABLE, detail=(
                f"owner of {request.partition}: a malformed answer, {len(response.values)} values for "
                f"{read_count} reads"))
    return response


def _too_large(partition: str, error: RequestTooLarge) -> ExecuteResponse:
    """A request the transport could not carry, answered as an owner's refusal of bad input (found
    by audit: taken for a bug, it ended the node; the client's operations were too large)."""
    return ExecuteResponse(ExecuteStatus.INVALID, detail=f"the request to {partition}: {error}")


def _first_to_name(failures: Sequence[ExecuteResponse]) -> ExecuteResponse:
    """The failure a caller is told of: an invalid input before any other, since a caller told
    "conflict" or "unavailable" would retry what must fail again; else the first."""
    assert failures
    return next((r for r in failures if r.status is ExecuteStatus.INVALID), failures[0])


def _outcome_of(reply: Reply) -> Outcome:
    if reply.outcome is TxnState.COMMIT:
        return Outcome(reply.txn, OutcomeStatus.COMMITTED)
    return Outcome(reply.txn, OutcomeStatus.ABORTED, AbortReason.VOTED_NO, reply.reason)


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


def _held_bytes(key: str, value: bytes | None) -> int:
    """What one write held for an open transaction counts against WRITES_HELD_BYTES_MAX."""
    return WRITE_HELD_ENTRY_BYTES + len(key) + len(value or b"")


def _no_reply(reply: asyncio.Future[Reply | None]) -> None:
    if not reply.done():
        reply.set_result(None)


def _unwired(_: object) -> None:
    raise AssertionError("Coordination used before the node wired it")
