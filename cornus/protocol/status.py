"""The status call's verdict: what the answers of a cluster's nodes say of one transaction.

A caller that lost its answer (a timeout, an UNKNOWN) asks the status call, and acts on what it
hears: "not known" means it never committed, so the caller may run it again. That rule decides
whether a transaction can commit twice, so it lives here, pure, where the simulator asks it of
its world at random moments and checks it against what the transaction became
(cornus/sim/world.py); cornus/runtime/admin.py gathers the real answers and asks the same.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from cornus.protocol import txn_ids
from cornus.protocol.config import OUTCOME_KEEP_MS_FLOOR, ProtocolConfig, gc_grace_ms_min
from cornus.protocol.termination import decision_among
from storage_adapters.contract import TxnState


class Known(enum.StrEnum):
    """What one node knows of the transaction itself (its wire form is the value)."""

    NOTHING = ""
    COMMITTED = "committed"
    ABORTED = "aborted"
    ACTIVE = "active"  # its coordinator runs its operations
    IN_DOUBT = "unknown"  # a commit under way here, or a participant's machine runs it

    @classmethod
    def of(cls, value: str) -> Known:
        """The wire form read back; anything else a node says of it (a newer node's word) is
        taken as in doubt, never as nothing."""
        try:
            return cls(value)
        except ValueError:
            return cls.IN_DOUBT


def memory_is_outcome(known: Known, client_chosen: bool) -> bool:
    """Whether the asked node's memory of a transaction it coordinated is its outcome, with no
    record read: COMMITTED, or ABORTED or ACTIVE of an id that node made (no other process runs
    it). Of a client-chosen id, which another process of the node may have run too, only
    COMMITTED: `verdict` ranks a COMMIT in the records above the rest (found by audit,
    2026-11-28: ABORTED was answered at once, no record read)."""
    return known is Known.COMMITTED or (known in (Known.ABORTED, Known.ACTIVE) and not client_chosen)


def request_deadline_ms(carried_ms: int, begin_ms: int, timeout_ms_request: int) -> int:
    """The deadline an owner keeps a one-shot's request (which carries its prepare) to: the one
    it carries (its begin plus its coordinator's wait for the answer), and never later than its
    begin plus the owner's own wait (found by audit: a coordinator whose configuration allowed a
    longer wait than the node asked for the status call, or an older one that carries none, had
    requests run after that node's window closed). 0: none (an id no runtime made, from a
    coordinator that carries none)."""
    own_ms = begin_ms + timeout_ms_request if begin_ms else 0
    return min(carried_ms, own_ms) if carried_ms and own_ms else carried_ms or own_ms


def kept_to_one_shot_window(txn: str, carries_prepare: bool) -> bool:
    """Whether an owner keeps a request to a one-shot's window (`request_deadline_ms`): one that
    carries its prepare, and any of a client-chosen id, which only one-shots have. The public gRPC
    API runs those as begin, operations and commit, its requests carrying no prepare; the client
    may send the id to two processes of the node, and one such request that travelled for seconds
    ran after the partition moved, into the decision its other run left there (found by audit,
    2026-11-28, third). An interactive transaction's requests keep none: its client may think."""
    return carries_prepare or txn_ids.is_client_chosen(txn)


def request_expired(deadline_ms: int, now_ms: int, clock_slack_ms: int) -> bool:
    """Whether a one-shot's request at its owner at `now_ms` must be refused: past its deadline
    (`request_deadline_ms`) and the clock slack, its coordinator gave up on it, and the status
    call may have told its caller "not known" since (`verdict`'s `requests_ms`). Asked as it
    arrives, and again before its carried prepare is fed (it may have waited for a lock or a
    read meanwhile), so that no vote leaves after that window (`late_vote_ms`)."""
    return deadline_ms > 0 and now_ms > deadline_ms + clock_slack_ms


def requests_window_ms(timeout_ms_request: int, clock_slack_ms: int) -> int:
    """How long after its begin a one-shot's request may still run at an owner whose wait is
    `timeout_ms_request`, by the asking node's clock: the deadline, plus the slack the owner
    grants (`request_expired`), plus the slack by which the owner's clock may run behind ours."""
    return timeout_ms_request + 2 * clock_slack_ms


def late_vote_ms(timeout_ms_request: int, config: ProtocolConfig) -> int:
    """How long after its begin a one-shot's vote may still land: its request runs at an owner up
    to `requests_window_ms`, and the vote's write lands up to a storage deadline, the slack and
    the backend's late window after that."""
    return (requests_window_ms(timeout_ms_request, config.clock_slack_ms) + config.storage_deadline_ms
            + config.clock_slack_ms + config.late_write_window_ms)


def late_votes_meet_their_tombstone(timeout_ms_request: int, config: ProtocolConfig) -> bool:
    """Whether the decision's tombstone still stands when a one-shot's vote lands at its latest:
    else a request that arrived after its transaction was collected could fill the emptied slots
    with votes (found by review: nothing compared them, and a long wait beside a short keep
    allowed it). The runtime refuses a configuration that breaks it; the simulator asserts it."""
    return late_vote_ms(timeout_ms_request, config) <= config.gc_grace_ms + config.outcome_keep_ms


def kept_floor_ms(config: ProtocolConfig) -> int:
    """How long after its begin a transaction that voted surely leaves a record, whatever
    outcome_keep_ms (which may be 0) and gc_grace_ms (which has a floor) the coordinator that
    collected it ran with: what the verdict counts on for a node whose configuration it cannot
    know (`NodeAnswer.since_ms`): the smallest grace, then the least keep a node runs with. The
    simulator's worlds that explore short keeps run below that floor, every process with `config`
    alone, so its own keep is then the least."""
    keep_ms = min(OUTCOME_KEEP_MS_FLOOR, config.outcome_keep_ms)
    return gc_grace_ms_min(config.storage_deadline_ms, config.clock_slack_ms) + keep_ms - config.clock_slack_ms


def kept_window_ms(config: ProtocolConfig) -> int:
    """How long after its begin a transaction that voted leaves a record, by a coordinator with
    `config`: records go gc_grace_ms after the decision, which comes after the begin, and the
    first participant's stays as the decision's tombstone for outcome_keep_ms more (by the
    coordinator's clock and storage's: the slack covers how far ours may differ)."""
    return config.gc_grace_ms + config.outcome_keep_ms - config.clock_slack_ms


def node_knows(*, remembered: Known, coordinating: bool, decision: TxnState | None, participating: bool) -> Known:
    """What one node tells of a transaction itself. `remembered`: what its coordinator remembers
    (its operations running: ACTIVE; an outcome it answered; a commit it told UNKNOWN).
    `coordinating`: its coordinator machine runs it, with `decision` if it has one.
    `participating`: a partition it holds runs it (a machine, whose vote's write may be on its
    way; or an execution, to which a Prepare may still come, be voted yes, and commit by
    termination). Either of the last two makes it in doubt, never nothing: no record need have
    landed yet (found by review: "no such transaction" of one about to commit)."""
    if remembered in (Known.COMMITTED, Known.ABORTED, Known.ACTIVE):
        return remembered
    if decision is not None:
        assert coordinating, "a decision without the machine that took it"
        return Known.COMMITTED if decision is TxnState.COMMIT else Known.ABORTED
    if coordinating or participating or remembered is Known.IN_DOUBT:
        return Known.IN_DOUBT
    assert remembered is Known.NOTHING, remembered
    return Known.NOTHING


@dataclass(frozen=True, slots=True)
class NodeAnswer:
    """One node's answer: whether it may be taken at its word (recovered), the partitions whose
    records it read (only those), the states it found there, and what it knows itself; and the
    windows its own configuration sets, which may differ from the asking node's during a change
    of configuration: how long a one-shot's request may run at it (`requests_window_ms`) and how
    long the records of a transaction it coordinated stay (`kept_window_ms`), and since when
    (`since_ms`: its process's start, by its clock; each process reads its configuration once).
    0: not told (an older node)."""

    ready: bool
    partitions: tuple[str, ...]
    states: tuple[TxnState, ...]
    known: Known
    requests_ms: int = 0
    kept_ms: int = 0
    since_ms: int = 0
    node: str = ""


class Verdict(enum.Enum):
    COMMITTED = "committed"
    ABORTED = "aborted"
    ACTIVE = "active"
    UNKNOWN = "unknown"  # in doubt, or not known by anyone who could know: never "never happened"


@dataclass(frozen=True, slots=True)
class StatusVerdict:
    verdict: Verdict
    detail: str = ""


def verdict(
    answers: Sequence[NodeAnswer | None], partitions: Sequence[str], begin_ms: int, asked_ms: int,
    answered_ms: int, *, config: ProtocolConfig, requests_ms: int, coordinator: str = "",
) -> StatusVerdict | None:
    """The verdict of `answers` (None: a node that did not answer) about a transaction that began
    at `begin_ms` (0: an id no runtime made), asked at `asked_ms`, before any node answered, and
    judged at `answered_ms`, after the last answer came (all by the clocks the slack covers): each
    answer tells of some moment between the two. None means "not known": nobody knows it and
    nobody can have forgotten it, so it
    never committed, and its caller may run it again. `requests_ms`: how long after its begin a
    one-shot's requests, which carry its prepare, may run at their owners (their deadline, which
    the owners keep to, plus the clock slack): until then one may be on its way, with nothing
    anywhere yet to tell of it. `config` and `requests_ms` are the asking node's; the windows its
    peers tell widen them (the longest wait, the shortest keep), since any of them may have
    coordinated the transaction or may run its request. `coordinator`: the node its id names.
    A coordinator that has left the cluster is counted as running with the keep the others do."""
    answered = [answer for answer in answers if answer is not None]
    knowns = {answer.known for answer in answered}
    states = [state for answer in answered for state in answer.states]
    decision = decision_among(states)
    # A COMMIT in the records before what a process remembers of aborting or running it: another
    # process of the node, sent the same client-chosen id, may have committed it (found by audit,
    # 2026-11-28: taken at its word, the memory said ABORTED of a committed transaction).
    if Known.COMMITTED in knowns or decision is TxnState.COMMIT:
        return StatusVerdict(Verdict.COMMITTED)
    for known, found in ((Known.ABORTED, Verdict.ABORTED), (Known.ACTIVE, Verdict.ACTIVE)):
        if known in knowns:
            return StatusVerdict(found)
    if decision is TxnState.ABORT:
        return StatusVerdict(Verdict.ABORTED)
    if states or Known.IN_DOUBT in knowns:
        return StatusVerdict(Verdict.UNKNOWN, "in doubt: no decision yet (participants voted, or a commit runs)")
    if len(answered) < len(answers):
        return StatusVerdict(Verdict.UNKNOWN, "some nodes did not answer")
    if not all(answer.ready for answer in answered):
        # A recovering node does not know yet what its logs hold (a coordinator-log coordinator's
        # COMMIT, a partition it is taking over): "nobody knows it" must wait.
        return StatusVerdict(Verdict.UNKNOWN, "some nodes are still recovering")
    read = {partition for answer in answered for partition in answer.partitions}
    unread = [partition for partition in partitions if partition not in read]
    if unread:
        # Between owners (a lease lapsed, nobody took it yet): its records were not read, and they
        # may be all the transaction has (found by review: "not known" then).
        return StatusVerdict(Verdict.UNKNOWN, (
            f"no node holds {', '.join(unread[:3])}{' ...' if len(unread) > 3 else ''} now, so its records "
            "could not be read"))
    requests_ms = max([requests_ms, *(answer.requests_ms for answer in answered)])
    assert asked_ms <= answered_ms, (asked_ms, answered_ms)
    # By the clock read before any answer: no request may run after the first answer was made.
    if begin_ms and asked_ms < begin_ms + requests_ms:
        # Found while moving this rule into the core: a one-shot whose coordinator died as its
        # requests left had, while they travelled, no execution, machine or record anywhere;
        # "not known" then, and they arrived, voted yes, and termination committed.
        return StatusVerdict(Verdict.UNKNOWN, "too recent to tell: a request of it may still be on its way")
    # Until then a transaction that voted has a record somewhere: none means it never did.
    kept_ms = min([kept_window_ms(config), *(answer.kept_ms for answer in answered if answer.kept_ms)])
    # Only its coordinator collects its records (its machine), keeping the tombstone for the
    # outcome_keep_ms its process ran with then. A coordinator process that started after the
    # transaction began cannot know what its predecessor ran with: count on the floor (found by
    # review: a rollout that raised the keep made the status call count on tombstones collected,
    # and dropped, under the old one).
    if any(answer.node == coordinator and not 0 < answer.since_ms <= begin_ms for answer in answered):
        kept_ms = min(kept_ms, kept_floor_ms(config))
    # An id without a begin time (0) is none a runtime made: never one of ours. By the clock read
    # after the last answer: its node may have read the tombstone that late, and it may have gone
    # by then (found by review: judged by the clock read before asking, a tombstone read up to a
    # peer request's deadline later had expired, and the status call said "not known").
    if begin_ms and answered_ms >= begin_ms + kept_ms:
        return StatusVerdict(Verdict.UNKNOWN, (
            "no node knows it and no record of it is left: it never committed, or it finished and its "
            f"outcome was kept for outcome_keep_ms ({config.outcome_keep_ms} ms) after its records "
            "were collected, which has passed; its outcome cannot be known"))
    return None

