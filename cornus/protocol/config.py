"""Which protocol runs, and every timeout and limit the protocol machines obey."""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields

from storage_adapters.contract import TOMBSTONE_KEEP_MS_MAX

# Renewal intervals a live process's record may go unrenewed (a paused process, storage slow or
# unreachable for it) before a parked process of its node takes the record for vacant
# (identity_vacant_ms). A wrong vacancy deposes a live holder once (safe, fenced, but a takeover);
# the wait it costs is paid only in the rare race that parks a node's newest process.
IDENTITY_RENEWALS_MISSED_MAX = 5
# A coordinator-log coordinator commits only if its redo record was durable (a write of it
# answered) within this long of its first write, whatever its own timeout_ms_votes and storage
# deadline; past it, it aborts, and issues no more writes of it. A node that recovers a
# participant's partition rebuilds that participant's yes vote from the record, and waits this
# long plus the slack before it reads it (recovery_settle_ms). A constant, not a setting: the
# recovering node cannot know the coordinator's configuration (found by audit: with its own
# timeout_ms_votes in the settle, and then with its own storage deadline, a coordinator configured
# longer, during a rolling change, landed its redo after the scan and committed a vote the new
# owner never held). As long as the default timeout_ms_votes, which asks the same of the redo.
REDO_DURABLE_MS_MAX = 200


class Protocol(enum.StrEnum):
    CORNUS = "cornus"
    TWO_PC = "2pc"
    COORDINATOR_LOG = "coordinator-log"


def gc_grace_ms_min(storage_deadline_ms: int, clock_slack_ms: int) -> int:
    """The shortest garbage-collection grace that keeps a late storage call harmless.

    A storage call that timed out may still land, up to its deadline plus the slack after it was
    issued. Records are deleted `gc_grace_ms` after the last participant acknowledged the decision;
    every call a participant or coordinator makes for the transaction was issued before that, so
    a grace above one deadline plus slack outlives them all. Manual resolve is not a participant:
    it reads a record (one deadline) and then writes (another), so the grace must outlive two."""
    return 2 * storage_deadline_ms + clock_slack_ms


def identity_window_admits(confirmed_ms: float | None, now_ms: float, window_ms: int) -> bool:
    """Whether a write storage cannot fence, made for the node itself and leaving at `now_ms`,
    lands before a later process of the node could have collected what it writes to:
    `confirmed_ms` is when the latest read, renewal or take of the identity record that found it
    this process's left (None: none yet), on the same clock, and `window_ms` is
    ProtocolConfig.identity_write_window_ms. The runtime (cornus.runtime.identity) and the
    simulator's world both ask this."""
    return confirmed_ms is not None and now_ms - confirmed_ms <= window_ms


# The least outcome_keep_ms any node runs with (cornus.runtime.config refuses less). The status
# call counts on it for a coordinator process that started after a transaction began, whose
# predecessor's keep it cannot know (status.kept_floor_ms): a one-shot whose coordinator died as
# its requests left can be told "not known" (run it again) only until its begin plus the smallest
# grace plus this floor. Counting on the grace alone, 10 s by default, a coordinator back after
# more than that left such a one-shot UNKNOWN for good (found by review, 2026-11-28). A minute
# covers a pod's first restarts; a decision's tombstone is one small record per transaction.
OUTCOME_KEEP_MS_FLOOR = 60_000


def outcome_keep_ms_min(storage_deadline_ms: int, clock_slack_ms: int, late_write_window_ms: int) -> int:
    """The shortest keep of a decision's tombstones where storage takes calls late
    (`late_write_window_ms`): a call sent before the tombstone was written lands within its
    deadline, the slack and the window after, and must meet the tombstone, not the gap it leaves."""
    if late_write_window_ms == 0:
        return 1
    return storage_deadline_ms + clock_slack_ms + late_write_window_ms


@dataclass(frozen=True, slots=True)
class ProtocolConfig:
    """Timeouts are in milliseconds of the runtime's (or simulator's) clock."""

    # A participant that hears nothing about its transaction for this long aborts it unilaterally:
    # it has not voted, so nobody can have committed.
    timeout_ms_prepare: int = 400
    # The coordinator waits this long for votes (and for read-only partitions to confirm their
    # read locks) before it terminates (Cornus) or aborts (2PC, coordinator-log).
    timeout_ms_votes: int = 200
    # A participant that voted yes waits this long for the decision before it terminates.
    timeout_ms_decision: int = 200
    # The coordinator resends the decision to participants that have not acknowledged it.
    timeout_ms_resend: int = 100
    # Retries against unreachable storage (and repeated termination queries) back off
    # exponentially from the minimum to the cap, with jitter so that participants of one
    # transaction do not hammer storage in lockstep.
    backoff_ms_min: int = 10
    backoff_ms_max: int = 320
    # The deadline the runtime puts on every storage call, and how late past it a call that timed
    # out may still land (requests queued in the network or the server, clock rates of nodes).
    storage_deadline_ms: int = 5000
    clock_slack_ms: int = 1000
    # Records are deleted this long after every participant acknowledged a durable decision.
    # At least gc_grace_ms_min(): a storage call still in flight must not recreate a deleted record.
    gc_grace_ms: int = 12_000
    # How long the decision's tombstone (storage_adapters.contract.Tombstone) outlives the records
    # garbage collection deletes: how long after a transaction the status call can still tell a
    # caller that lost its answer what became of it. Storage holds one small record per
    # transaction for this long (some 600,000 at 1,000 transactions a second).
    outcome_keep_ms: int = 600_000
    # How long past its deadline plus the slack a storage call may still land, where storage
    # itself cannot refuse a late call (DynamoDB checks no deadline, only its signatures age out,
    # after minutes; Azure's expire at the call's deadline by the node's clock, which may run ahead
    # of Azure's: the window covers 15 minutes of it). 0: storage refuses any call past its deadline
    # (Redis's scripts, the emulator's writer), so the grace alone outlives every call in flight.
    # Above 0, garbage collection leaves every participant's record as a tombstone, never a gap a
    # late vote could fill, and the tombstones outlive the window (found by review: a vote that
    # timed out landed after its record was collected, and recovery applied its old redo again).
    late_write_window_ms: int = 0
    # A record deletion is retried this often while storage is unreachable, then left in place:
    # a decided record left behind is garbage, never a wrong answer.
    gc_attempt_count_max: int = 8
    # Records one recovery scan call returns at most (a page may hold fewer and not be the last).
    scan_page_count_max: int = 500
    # How often a node reads its identity record with no presumed ABORT waiting for it
    # (cornus.protocol.hosts): how long a process that a later one of the same node id replaced
    # may go on coordinating (Cornus transactions, which is safe) before it learns it and parks.
    identity_check_ms: int = 2_000
    # How long a Cornus coordinator's termination may go on asking the participants' logs before
    # it gives up (its caller heard UNKNOWN at the commit deadline long before; each participant
    # that voted terminates by itself, so nothing waits on the coordinator's answer). A bound on
    # its retries, and what a collector of crashed transactions' records must outwait: a
    # coordinator still asking after that could write ABORT into a collected record's slot
    # (docs/sweeper-design.md, step 1). The default is the default grace.
    coordinator_terminate_ms_max: int = 12_000

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            assert isinstance(value, int) and not isinstance(value, bool), f"{item.name} must be an int"
            assert value > 0 or (item.name == "late_write_window_ms" and value == 0), (
                f"{item.name} must be positive, got {value}")
        assert self.backoff_ms_min <= self.backoff_ms_max
        assert self.timeout_ms_resend <= self.backoff_ms_max, "decision resends back off from the one to the other"
        assert self.outcome_keep_ms <= TOMBSTONE_KEEP_MS_MAX, self.outcome_keep_ms
        assert self.gc_grace_ms >= gc_grace_ms_min(self.storage_deadline_ms, self.clock_slack_ms), (
            f"gc_grace_ms {self.gc_grace_ms} must be at least twice the storage deadline plus the slack"
        )
        keep_ms_min = outcome_keep_ms_min(self.storage_deadline_ms, self.clock_slack_ms, self.late_write_window_ms)
        assert self.outcome_keep_ms >= keep_ms_min, (
            f"outcome_keep_ms {self.outcome_keep_ms} must outlive a late call: at least {keep_ms_min}"
        )

    @property
    def grace_ms_min(self) -> int:
        """The least grace after which no storage call of this node's can still land: what its
        acknowledgements tell a coordinator to wait out before collecting (DecisionAck)."""
        return gc_grace_ms_min(self.storage_deadline_ms, self.clock_slack_ms)

    @property
    def identity_write_window_ms(self) -> int:
        """How long after a read (or renewal, or the take) of the node's identity record left that
        found it still this process's, the process may still make a write storage cannot fence
        for the node itself (its coordinator's termination LogOnce(ABORT) on a participant's log,
        its collection's deletes; cornus.runtime.identity). Such a write lands within a storage
        deadline plus the slack of leaving. A later process of the node took the identity after
        that read was answered, and collects a transaction (the same one, when a client sent its
        one-shot again with the same id) at least gc_grace_ms after its take: so the write lands
        before anything it could re-create was collected. (Found by review: a process cut off
        past the other's collection re-created a deleted record as ABORT, beside a COMMIT.) At
        least one storage deadline, by gc_grace_ms's own rule."""
        return self.gc_grace_ms - self.storage_deadline_ms - self.clock_slack_ms

    @property
    def identity_learn_ms(self) -> int:
        """How long after its latest read of the identity record that found it its own a process
        may still believe it holds the node's identity: the holder reads it every
        identity_check_ms, and a read owed while another is out leaves when that one answers, each
        within a storage deadline. A later process's take is learnt by then from a read that
        finds it (txn_ids.predecessor_may_have_run counts on it), and a process that heard no
        answer by then does not know (txn_ids.identity_fresh_for_client_ids)."""
        return self.identity_check_ms + 2 * self.storage_deadline_ms

    @property
    def identity_vacant_ms(self) -> int:
        """How long a parked process (one a later process of its node deposed) must see the
        node's identity record unchanged before it takes the record for vacant and exits, to be
        restarted (cornus.protocol.identity_watch). The holder renews the record every
        identity_check_ms; two renewals that both land in time can still be a tick plus two
        deadlines apart (a renewal owed while a presumption read is out leaves when that read
        answers, and then takes its own deadline to land), and the clocks may differ by the
        slack. Past that, IDENTITY_RENEWALS_MISSED_MAX ticks without one. (Found by review: a
        window of 3 ticks + 1 deadline + slack could depose a live holder on slow storage.)"""
        return (IDENTITY_RENEWALS_MISSED_MAX * self.identity_check_ms + 2 * self.storage_deadline_ms
                + self.clock_slack_ms)

    @property
    def recovery_settle_ms(self) -> int:
        """How long a restarted node waits before recovery scans storage. Calls its previous life
        made land within a deadline plus slack; and a coordinator-log participant keeps no record
        of its yes vote, which recovery rebuilds from the coordinator's redo record: one that can
        commit was durable within REDO_DURABLE_MS_MAX of the coordinator's start, so of the
        prepare that reached the participant before it crashed. Scanning earlier could miss
        either, and the transaction's locks with it. (Their sum bounds both, and costs a restart at
        most REDO_DURABLE_MS_MAX more than the larger.)"""
        return REDO_DURABLE_MS_MAX + self.storage_deadline_ms + self.clock_slack_ms
