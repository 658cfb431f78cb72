"""A schedule: everything that varies between simulator runs, drawn from one seeded RNG (the
explorer) or built by hand or by hypothesis (the tests). Times are simulated milliseconds.

A world runs a few transactions over a few partitions, on coordinator nodes c0, c1 and one node per
partition (n0 owns p0, ...). Transactions may share keys (and so locks) and may each run another
protocol. Faults: crashes and restarts, storage outages (some longer than any retry budget),
storage calls that time out but land later, lost, delayed and duplicated messages (some copies
arrive long after garbage collection), reads of the owner's cache misses that answer late, callers
that think between an interactive transaction's reads and writes while the owner restarts, a
partition moving to another node (its old owner's lease lapsed; storage fences its writes; held
by nobody for a while in between, or not), a
coordinator's second process started while its first still runs (a force-deleted pod), the
WAIT_DIE lock policy, tiny recovery scan pages, and manual resolves. Interactive transactions read first and write in a
continued request (one schedule in eight makes its first transaction wholly read-only); one-shots
carry their prepares.
"""

from __future__ import annotations

import dataclasses
import random
import zlib
from dataclasses import dataclass

from cornus.protocol.config import Protocol

# Faults (crashes, outages, slow calls, message loss for the blocking protocols) happen only before
# this time; afterwards every node is up and storage is reachable, so liveness can be judged.
FAULTS_END_MS = 1000
# A cut Twin's first process (Twin.cut_ms) may live past the other faults' end, up to this: what
# it does when it is back, after the second process collected what they both ran, is the point.
TWIN_CUT_END_MS_MAX = 2_000
# A storage-only cut (Twin.storage_only) lasts past the first process's identity_learn_ms (the
# world's 1 s identity check and two deadlines), so that one-shots reach it after its identity
# went stale: its Twin may live up to this.
STORAGE_CUT_END_MS_MAX = 2_600
# The shortest late window of storage that takes calls late: above the longest grace a schedule
# gets (2 deadlines of 2 * 40 + 1 ms, plus the slack, or 1 s), so that late calls land after
# garbage collection.
LATE_WINDOW_MS_MIN = 2_000
# How far apart two nodes' clocks may run: the world's clock slack (CLOCK_SLACK_MS); each is within
# half of it of storage's (_clock_offset_ms).
CLOCK_OFFSET_MS_MAX = 20
# How late past its deadline a timed-out storage call may land (the world's clock slack).
CLOCK_SLACK_MS = 20
# The longest a Move's old owner goes on before it notices its lease ended: past a grace and a
# tombstone's keep here, so that what a host does without a lease can land after collection.
LAPSE_MS_MAX = 4_000
KEYS_PER_PARTITION = 2
PARTITION_COUNT_MAX = 8
COORDINATORS = ("c0", "c1")


@dataclass(frozen=True, slots=True)
class TxnPlan:
    """One transaction: it increments one key per written partition and reads one key per
    partition it only reads; `votes` says, per written partition, whether it wants to commit."""

    coordinator: str
    protocol: Protocol
    start_ms: int
    writes: tuple[tuple[str, int], ...]
    reads: tuple[tuple[str, int], ...] = ()
    votes: tuple[bool, ...] = ()
    # A one-shot whose requests carry the prepare (CommitRequested.prepare_sent): the caller
    # names each write's value up front, so each key is checked to hold the version the caller
    # expects and then set to the next one, all in the one request per partition; a partition
    # it only reads votes too, after its read.
    one_shot: bool = False
    # Every request of this one-shot is held up Schedule.late_request_ms (where late requests are
    # on), not only some.
    late: bool = False

    def __post_init__(self) -> None:
        assert self.coordinator in COORDINATORS
        written = [p for p, _ in self.writes]
        read = [p for p, _ in self.reads]
        assert written or read, "a transaction touches some partition"
        assert written or not self.one_shot, "a wholly read-only transaction runs interactively here"
        assert len(set(written)) == len(written), "one key per written partition"
        assert len(set(read)) == len(read) and not set(read) & set(written)
        assert not self.votes or len(self.votes) == len(self.writes)
        assert all(0 <= key < KEYS_PER_PARTITION for _, key in (*self.writes, *self.reads))

    @property
    def vote_of(self) -> dict[str, bool]:
        votes = self.votes or (True,) * len(self.writes)
        return {p: yes for (p, _), yes in zip(self.writes, votes, strict=True)}


@dataclass(frozen=True, slots=True)
class Crash:
    node: str
    at_ms: int
    down_ms: int


@dataclass(frozen=True, slots=True)
class Move:
    """`partition` moves to node `to` at `at_ms`: its owner's lease ran out (it drops the
    partition; its calls in flight still land, their answers are dropped), and `to` takes it in a
    higher epoch, so storage refuses the old owner's fenced writes from then on, and recovers its
    log. `to` may be a coordinator (then one node is both, as every runtime node is), the old
    owner itself (its lease lapsed and it took the partition again), or a node that held it
    before. With `gap_ms`, nobody holds the partition meanwhile, as in the runtime, where the old
    owner stops serving when its lease runs out by its own clock and the next one takes it only
    after the lease and the clock slack: `to` takes it `gap_ms` after the old owner dropped it (or
    once it is up and recovered, if it is not then), and until then messages to the partition are
    lost, requests to it refused or unanswered, and no status answer reads its records. With
    `lapse_ms`, the old owner notices that its lease ended only that much later (a process that
    stalled, or between its ownership ticks): until then its host of the partition hears its
    calls' answers, which the world holds and feeds it when it notices, as a process back from a
    stall runs the I/O that piled up; it may then do only what a host without a lease may
    (cornus.protocol.ownership.without_lease_may), and drops the partition. With `after`, the
    move waits (up to when faults end) for the worst moment: "scan", while the owner's recovery
    of the partition has a scan out (whose answer the lapse then holds); "vote", until the
    partition's log holds a yes vote of a transaction not decided there; "read", while a slow read
    of the owner's is out on the partition (Schedule.slow_read_ms)."""

    partition: str
    to: str
    at_ms: int
    gap_ms: int = 0
    lapse_ms: int = 0
    after: str = ""


@dataclass(frozen=True, slots=True)
class Twin:
    """At `at_ms` a second process starts as coordinator `node` while the first one runs on for
    `overlap_ms` more, then dies: a pod force-deleted while its process still ran, and its
    replacement. Both answer messages sent to the node, both write its coordinator log; only
    transaction ids (the incarnation is one of their fields) tell their transactions apart."""

    node: str
    at_ms: int
    overlap_ms: int
    # When above 0: `cut_after_ms` after the second process starts, the first is cut off from
    # storage and the network (a partitioned host) for `cut_ms`, then comes back. Until the cut,
    # one-shots for the node still reach the first (a client's old connection); at the cut their
    # client, told nothing, sends them again with their ids, and the second process runs them
    # too (the runtime accepts an id begun after its start that it does not know), commits and
    # collects them while the first is away. (Found by review: the first process, back, wrote
    # into what the second had collected.)
    cut_after_ms: int = 0
    cut_ms: int = 0
    # When true, the cut is of storage alone (a firewall rule, a storage endpoint's DNS) and
    # starts `-cut_after_ms` before the second process does, so that the first never hears its
    # renewal refused: its messages and replies pass, one-shots for the node keep reaching it
    # all through the cut (a client's old connection), and a proxy delivers half of them to the
    # second process too, which refuses them for load (World._refused_for_load). What this
    # explores is the "nothing ran" side of the client-id rules: the first must stop beginning
    # client ids once its identity is stale (txn_ids.identity_fresh_for_client_ids), for the
    # second's refusal past its predecessor's window (txn_ids.predecessor_may_have_run) to be
    # true (found by audit, 2026-11-28, second; explored since 2026-11-28, third).
    storage_only: bool = False

    @property
    def cut_start_ms(self) -> int:
        return self.at_ms + self.cut_after_ms

    @property
    def cut_end_ms(self) -> int:
        return self.cut_start_ms + self.cut_ms


@dataclass(frozen=True, slots=True)
class Abandon:
    """Sweep schedules: the coordinator of transaction number `txn_index` is killed `after_ms`
    into the grace its collection waits out (when it starts its gc timer; within the grace at
    most), and never restarts: the decided records it would have collected are left behind, for
    the sweepers (docs/sweeper-design.md). Only where nothing else of that node can wait on it
    (World._abandon says when)."""

    txn_index: int
    after_ms: int


@dataclass(frozen=True, slots=True)
class StorageCut:
    """Sweep schedules: coordinator `node`'s only process is cut off from storage alone (its
    messages pass) from `start_ms` to `end_ms`, which may be long after faults end: a Cornus
    coordinator terminating then retries through it for as long as its bound lets it
    (ProtocolConfig.coordinator_terminate_ms_max), and, back, writes what it still has to,
    maybe after sweepers collected the transaction and their tombstones expired."""

    node: str
    start_ms: int
    end_ms: int


@dataclass(frozen=True, slots=True)
class Outage:
    """Storage unreachable for the named logs (log keys) from start to end."""

    logs: tuple[str, ...]
    start_ms: int
    end_ms: int


@dataclass(frozen=True, slots=True)
class Resolve:
    """An operator resolves transaction number `txn_index` by hand at `at_ms`."""

    at_ms: int
    txn_index: int


@dataclass(frozen=True, slots=True)
class Schedule:
    seed: int
    partition_count: int
    txns: tuple[TxnPlan, ...]
    loss_probability: float = 0.0
    delay_ms_max: int = 20
    storage_ms_max: int = 10
    # An unreachable storage call takes effect anyway with this probability (it timed out after
    # the write landed), which is what makes retries and terminations subtle.
    ambiguous_probability: float = 0.5
    # A call outside any outage is slow with this probability: its caller is told "unreachable"
    # at the deadline, and the call lands (or not) up to the clock slack after it.
    late_call_probability: float = 0.0
    # Where storage cannot refuse a call past its deadline (DynamoDB, Azure Blob: the core's
    # late_write_window_ms), a slow call may land this much later still: past the garbage
    # collection of its transaction. 0: storage refuses it after the deadline plus the slack.
    late_window_ms: int = 0
    # A message is delivered twice with this probability; half the second copies come after the
    # garbage-collection grace, when the transaction may be long gone.
    duplicate_probability: float = 0.0
    # A one-shot's request is held up this much longer with this probability (stuck behind a
    # peer's queue, or a slow link): it may run and vote after a restart of another partition's
    # owner, or after the coordinator gave up on it.
    late_request_probability: float = 0.0
    late_request_ms: int = 0
    # Whether the owners keep a one-shot's requests to their deadline: refused when they arrive
    # past it (plus the slack). Owners of an older version keep to none, during a rolling
    # upgrade: late requests run there whenever they arrive.
    request_deadlines: bool = True
    # A one-shot's storage read (on a miss in the owner's cache) answers this late with this
    # probability: its execution may be aborted or idle out meanwhile, and another transaction
    # commit a newer value of the key, which the late answer predates.
    slow_read_probability: float = 0.0
    slow_read_ms: int = 0
    # An interactive transaction's writes follow its reads this much later (a caller that thinks
    # between its requests): the owner may restart meanwhile and lose the read locks.
    think_ms: int = 0
    # The lock policy of every partition: WAIT_DIE (an older request waits for a younger holder)
    # instead of NO_WAIT (which waits only behind a holder that voted).
    wait_die: bool = False
    scan_page_max: int = 500
    crashes: tuple[Crash, ...] = ()
    moves: tuple[Move, ...] = ()
    twins: tuple[Twin, ...] = ()
    outages: tuple[Outage, ...] = ()
    resolves: tuple[Resolve, ...] = ()
    # Identity renewals every 20 ms, shorter than a storage deadline, and half the identity calls
    # (takes, renewals and reads, a parked process's watch) answered just before their deadline,
    # landing anywhere before: the regime where a live holder's renewals are furthest apart and a
    # watch's answers latest (found by review: a parked process could take a live holder's
    # identity for vacant there, and none of the simulator's schedules reached it).
    slow_identity: bool = False
    # A Cornus coordinator's termination gives up after this long (ProtocolConfig.
    # coordinator_terminate_ms_max; 0: the default, longer than a run), so that giving up amid
    # outages, losses and crashes is explored.
    terminate_limit_ms: int = 0
    # How far each named node's clock runs ahead of storage's (behind, when negative: _clock_offset_ms;
    # others: 0): any two differ by at most the clock slack, as the runtime assumes of its nodes. What reads
    # a clock: a transaction id's begin (its coordinator's), an owner's check of a one-shot
    # request's deadline, the status call's verdict (the asking node's).
    clock_offsets_ms: tuple[tuple[str, int], ...] = ()
    # Whether the last coordinator is a node a rollout added: the other nodes' configurations
    # predate it and do not name it, so only what storage lists tells their recoveries that its
    # coordinator log exists (found by review: recovery scanned the configured nodes' logs only,
    # and lost the coordinator-log yes votes that only the added node's redo records held).
    rollout: bool = False
    # Whether storage answers scans as a backend that walks finished records does (Azure's
    # listing, DynamoDB's filtered query): a page may stop partway, at a record or at a finished
    # one before it, maybe with no record, and says where the next one starts (found by review: a
    # scan that walked every tombstone in one call outlived its deadline, so pages now stop short).
    short_scans: bool = False
    # Sweep schedules (random_schedule's `sweeps`): every node runs a sweeper per partition it
    # holds and one for its own coordinator log (cornus.protocol.sweeper), a pass this often (0:
    # none: the existing streams), of pages this long, this many a pass; the world checks
    # every tombstone one writes against what could still write or read the record, and, at the
    # end, that the records crashes left behind were collected (cornus.sim.sweeps).
    sweep_interval_ms: int = 0
    sweep_page_count_max: int = 100
    sweep_pages_per_pass_max: int = 10
    # The nodes' sweep budget (SweepConfig.calls_per_s_max): the runtime's default, or one low
    # enough that the sweepers of a node wait for each other's pages, and a partition is dropped
    # while its sweeper waits or holds the node's turn.
    sweep_calls_per_s_max: int = 200
    abandons: tuple[Abandon, ...] = ()
    storage_cuts: tuple[StorageCut, ...] = ()
    # A message, or a one-shot's request, also arrives again this long after it was sent (with
    # the probability below): after the sweepers collected its transaction, and, when this is past
    # the tombstones' keep too, after those expired.
    late_copy_ms: int = 0
    late_copy_probability: float = 0.0
    # Decisions' tombstones kept only as long as the configuration allows (ProtocolConfig.
    # outcome_keep_ms at outcome_keep_ms_min, shorter than the grace): what a sweeper that kept its
    # tombstones outcome_keep_ms alone, not the grace and the late window too, gets wrong.
    short_keep: bool = False

    def __post_init__(self) -> None:
        assert 1 <= self.partition_count <= PARTITION_COUNT_MAX
        assert self.txns
        for plan in self.txns:
            assert all(int(p[1:]) < self.partition_count for p, _ in (*plan.writes, *plan.reads))
        assert 0.0 <= self.loss_probability < 1.0
        assert 0.0 <= self.late_request_probability <= 1.0 and self.late_request_ms >= 0
        assert 0.0 <= self.slow_read_probability <= 1.0 and self.slow_read_ms >= 0
        assert self.think_ms >= 0
        assert self.delay_ms_max >= 1 and self.storage_ms_max >= 1 and self.scan_page_max >= 1
        for crash in self.crashes:
            assert 0 <= crash.at_ms <= FAULTS_END_MS and crash.down_ms >= 1
        half_ms = CLOCK_OFFSET_MS_MAX // 2
        assert all(-half_ms <= offset_ms <= half_ms for _, offset_ms in self.clock_offsets_ms)
        assert all(offset_ms >= 0 for name, offset_ms in self.clock_offsets_ms if name in COORDINATORS)
        nodes = {*COORDINATORS, *(node_of(p) for p in self.partitions)}
        taken_ms: dict[str, int] = {}
        for move in sorted(self.moves, key=lambda move: move.at_ms):
            assert move.partition in self.partitions and move.to in nodes, move
            assert move.at_ms >= 0 and move.gap_ms >= 0 and move.at_ms + move.gap_ms <= FAULTS_END_MS, move
            assert 0 <= move.lapse_ms <= LAPSE_MS_MAX and move.after in ("", "scan", "vote", "read"), move
            # A lease nobody holds cannot lapse: a partition's next move comes after its gap.
            assert move.at_ms >= taken_ms.get(move.partition, 0), f"{move} within the gap of the one before"
            taken_ms[move.partition] = move.at_ms + move.gap_ms
        for twin in self.twins:
            # Coordinators only: a partition's two processes are ownership's case (fenced writes,
            # explored by ownership_world), and moves would need both processes' tenures.
            assert twin.node in COORDINATORS and not self.moves, twin
            ends_by_ms = (STORAGE_CUT_END_MS_MAX if twin.storage_only else TWIN_CUT_END_MS_MAX if twin.cut_ms
                          else FAULTS_END_MS)
            assert twin.at_ms >= 0 and twin.overlap_ms >= 1 and twin.at_ms + twin.overlap_ms <= ends_by_ms, twin
            # A cut first process comes back before it dies: what it does then is the point.
            assert twin.cut_ms == 0 or twin.cut_after_ms + twin.cut_ms < twin.overlap_ms, twin
            # A whole cut comes once the second process runs; a storage-only one before it takes
            # the identity.
            assert twin.cut_ms == 0 or twin.storage_only or twin.cut_after_ms >= 1, twin
            assert not twin.storage_only or (twin.cut_ms > 0 and 0 <= twin.cut_start_ms <= twin.at_ms), twin
        assert len({twin.node for twin in self.twins}) == len(self.twins), "one second process per node"
        for outage in self.outages:
            assert 0 <= outage.start_ms <= outage.end_ms <= FAULTS_END_MS
        for resolve in self.resolves:
            assert 0 <= resolve.txn_index < len(self.txns)
        assert self.sweep_interval_ms >= 0 and self.sweep_page_count_max >= 1 and self.sweep_pages_per_pass_max >= 1
        assert self.sweep_calls_per_s_max >= 1, self.sweep_calls_per_s_max
        assert self.sweep_interval_ms or not (self.abandons or self.storage_cuts or self.late_copy_probability), (
            "abandons, storage cuts and late copies are sweep schedules' faults")
        for abandon in self.abandons:
            assert 0 <= abandon.txn_index < len(self.txns) and abandon.after_ms >= 0, abandon
        for cut in self.storage_cuts:
            # A coordinator's only process: a Twin's cut is Twin.storage_only; a partition's holder
            # cut from storage would go on serving without a lease, which no runtime does.
            assert cut.node in COORDINATORS and not self.twins and not self.moves, cut
            assert 0 <= cut.start_ms < cut.end_ms, cut
        assert len({cut.node for cut in self.storage_cuts}) == len(self.storage_cuts), "one cut per node"
        assert 0.0 <= self.late_copy_probability <= 1.0 and self.late_copy_ms >= 0

    @property
    def partitions(self) -> tuple[str, ...]:
        return tuple(f"p{i}" for i in range(self.partition_count))

    @property
    def protocols(self) -> frozenset[Protocol]:
        return frozenset(plan.protocol for plan in self.txns)

    @classmethod
    def single(
        cls,
        protocol: Protocol,
        votes: tuple[bool, ...],
        *,
        seed: int = 7,
        read_only_count: int = 0,
        **faults: object,
    ) -> Schedule:
        """One transaction at time 0, coordinated by c0, writing p0..p(n-1) and only reading the
        next `read_only_count` partitions: the paper's single-transaction scenarios."""
        writes = tuple((f"p{i}", 0) for i in range(len(votes)))
        reads = tuple((f"p{len(votes) + i}", 0) for i in range(read_only_count))
        plan = TxnPlan("c0", protocol, 0, writes, reads, votes)
        return cls(seed=seed, partition_count=len(votes) + read_only_count, txns=(plan,), **faults)  # type: ignore[arg-type]


def node_of(partition: str) -> str:
    """The simulated node that owns a partition."""
    return "n" + partition[1:]


def _clock_offset_ms(seed: int, name: str) -> int:
    """How far node `name`'s clock runs ahead of storage's (behind, when negative): up to half of
    CLOCK_OFFSET_MS_MAX either way, so that any two differ by the slack at most. A coordinator's
    runs ahead only: the world's time starts at 0, and a clock behind it would begin transaction
    ids before the Unix epoch, which no real clock does (their begins would read as no time)."""
    draw = zlib.crc32(f"{seed}/{name}/clock".encode())
    if name in COORDINATORS:
        return draw % (CLOCK_OFFSET_MS_MAX // 2 + 1)
    return draw % (CLOCK_OFFSET_MS_MAX + 1) - CLOCK_OFFSET_MS_MAX // 2


def random_schedule(rng: random.Random, protocol: Protocol | None, *, twins: bool = False,
                    storage_cuts: bool = False, sweeps: bool = False) -> Schedule:
    """A cheap, varied schedule: small clusters, mostly yes votes, frequent faults. `protocol`
    None mixes the protocols, one per transaction. `twins`: one schedule in eight starts a second
    process of a coordinator beside the first (Twin); off by default, since 2PC and
    coordinator-log do not survive it (docs/deploy.md, "One process per node id"). With it,
    another one in eight cuts the first process off: from everything, or, with `storage_cuts`,
    from storage alone (Twin.storage_only; a flag of its own, so that every seed of the
    `twins` stream stays what it was). `sweeps`: every node runs sweepers, and the faults that
    leave records behind for them are added (`with_sweeps`), from a generator of their own: the
    rest of each schedule, and of the stream, stays what it was."""
    partition_count = rng.choice((1, 2, 2, 3, 3, 3, 4, 5))
    partitions = [f"p{i}" for i in range(partition_count)]
    txns = []
    for index in range(rng.choice((1, 1, 2, 2, 3, 4))):
        chosen = rng.sample(partitions, rng.randrange(1, min(3, partition_count) + 1))
        others = [p for p in partitions if p not in chosen]
        reads = [rng.choice(others)] if others and rng.random() < 0.3 else []
        txns.append(TxnPlan(
            coordinator=rng.choice(COORDINATORS),
            protocol=protocol or rng.choice(list(Protocol)),
            start_ms=0 if index == 0 else rng.randrange(0, 400),
            writes=tuple((p, rng.randrange(KEYS_PER_PARTITION)) for p in chosen),
            reads=tuple((p, rng.randrange(KEYS_PER_PARTITION)) for p in reads),
            votes=tuple(rng.random() < 0.9 for _ in chosen),
            # Not drawn from `rng`: the schedules of every seed stay what they were before one-shots.
            one_shot=zlib.crc32(f"{index}/{chosen}/{partition_count}".encode()) % 2 == 0,
        ))
    nodes = [*COORDINATORS, *(node_of(p) for p in partitions)]
    crashes = tuple(
        Crash(rng.choice(nodes), rng.randrange(0, 400 if rng.random() < 0.7 else FAULTS_END_MS), rng.randrange(1, 600))
        for _ in range(rng.choice((0, 1, 1, 2, 3)))
    )
    logs = [*(f"c.{c}" for c in COORDINATORS), *(f"p.{p}" for p in partitions)]
    outages = []
    for _ in range(rng.choice((0, 0, 1, 2))):
        start = rng.randrange(0, 600)
        chosen_logs = tuple(sorted(rng.sample(logs, rng.randrange(1, len(logs) + 1))))
        # Some outages last until faults end: longer than any bounded retry of the runtime.
        length = FAULTS_END_MS if rng.random() < 0.2 else rng.randrange(1, 500)
        outages.append(Outage(chosen_logs, start, min(FAULTS_END_MS, start + length)))
    resolves = tuple(
        Resolve(rng.randrange(0, 3 * FAULTS_END_MS), rng.randrange(len(txns)))
        for _ in range(rng.choice((0, 0, 0, 1, 2)))
    )
    seed = rng.getrandbits(32)
    # Not drawn from `rng` either: a schedule in eight holds some one-shot requests up for longer
    # than a restart's recovery takes, from the seed it already has.
    late = seed % 8 == 0
    one_shots = [index for index, plan in enumerate(txns) if plan.one_shot and plan.start_ms < FAULTS_END_MS]
    if late and one_shots:
        # What the status call's "too recent" window and the owners' deadline protect: a one-shot
        # whose coordinator crashes as its requests leave, all of them held up, so that nothing
        # anywhere tells of it while they travel, and the coordinator may be back before they land.
        first = txns[one_shots[0]]
        txns[one_shots[0]] = dataclasses.replace(first, late=True)
        crashes += (Crash(first.coordinator, first.start_ms + 1, 1 + (seed >> 4) % 40),)
    # Likewise a schedule in eight answers some cache misses' reads later than an execution's
    # idle timeout or a coordinator's request deadline.
    # Half the schedules that move a partition (seed % 8 == 6, below) have slow reads too, from a
    # hash of the seed: a partition lost while a read of its owner is out is the case.
    slow_move = seed % 8 == 6 and zlib.crc32(f"{seed}/slow-move".encode()) % 2 == 0
    slow_reads = seed % 8 == 4 or slow_move
    slow_read_ms = 220 + seed % 300
    if seed % 8 == 1:
        # One schedule in eight makes its first transaction wholly read-only: its partitions only
        # confirm that they still hold its read locks, and nobody logs anything.
        first = txns[0]
        txns[0] = dataclasses.replace(first, writes=(), reads=(*first.writes, *first.reads), votes=(), one_shot=False)
    # And one in eight has callers that think between an interactive transaction's reads and its
    # writes for longer than a restart takes.
    thinking = seed % 8 == 2
    think_ms = 100 + seed % 500
    interactive = [plan for plan in txns if not plan.one_shot]
    if thinking and interactive:
        # What a restart between the reads and the writes can hurt: the owner of the first
        # interactive transaction's first written partition restarts while its caller thinks, and
        # the transactions run again once it is back.
        first = interactive[0]
        crashes += (Crash(node_of(first.writes[0][0]), first.start_ms + 2, 1 + seed % 40),)
        txns += [dataclasses.replace(plan, start_ms=plan.start_ms + think_ms // 2) for plan in list(txns)]
    if slow_reads:
        # What a late answer can hurt is a later transaction on the same keys: each one of these
        # schedules runs its transactions again, once the first runs' reads are out and once
        # they have landed.
        txns += [
            dataclasses.replace(plan, start_ms=plan.start_ms + shift)
            for shift in (slow_read_ms // 2, slow_read_ms + 100) for plan in list(txns)
        ]
    # And one in eight moves a partition to another node while transactions run on it (another
    # partition's node or a coordinator), and then, in two of three, back to its first node or to
    # the same node again (its lease lapsed and it took it back). Half of those leave it held by
    # nobody for 50 to 400 ms each time (Move.gap_ms; not drawn from `rng` either), as the runtime
    # does between a lease running out and the next owner's take.
    moves: tuple[Move, ...] = ()
    if seed % 8 == 6:
        index = (seed >> 3) % partition_count
        partition = f"p{index}"
        targets = [*(node_of(f"p{i}") for i in range(partition_count) if i != index), *COORDINATORS]
        to = targets[(seed >> 6) % len(targets)]
        at_ms = 20 + (seed >> 9) % 500
        gap_draw = zlib.crc32(f"{seed}/gap".encode())
        # At most half of what is left before faults end: a second move's gap fits after the first.
        gap_ms = min(50 + gap_draw % 351, (FAULTS_END_MS - at_ms) // 2) if gap_draw >> 31 else 0
        moves = (Move(partition, to, at_ms, gap_ms),)
        again_ms = min(FAULTS_END_MS - gap_ms, at_ms + gap_ms + 250 + (seed >> 14) % 400)
        if (seed >> 12) % 3 == 0:
            moves += (Move(partition, node_of(partition), again_ms, gap_ms),)
        elif (seed >> 12) % 3 == 1:
            moves += (Move(partition, to, again_ms, gap_ms),)
        # Half of them give a move a lapse (Move.lapse_ms, from a hash of the seed as the gap). In
        # half of those the first move comes once a yes vote is in the partition's log, and the
        # second once the first move's new owner scans that log in its recovery: what a lapse can
        # hurt is that scan's answer, heard without a lease, from which recovery starts
        # terminations that write other partitions' logs.
        lapse_draw = zlib.crc32(f"{seed}/lapse".encode())
        if lapse_draw >> 31:
            lapse_ms = 1 + lapse_draw % LAPSE_MS_MAX
            soon_ms = at_ms + 2 * gap_ms + 1
            if len(moves) == 2 and (lapse_draw >> 30) & 1 and soon_ms <= FAULTS_END_MS:
                second = Move(partition, moves[1].to, soon_ms - gap_ms, gap_ms, lapse_ms, after="scan")
                moves = (dataclasses.replace(moves[0], after="vote"), second)
                # Votes on the partition in flight at the first move: the records that scan finds.
                writers = [plan for plan in txns if partition in (p for p, _ in plan.writes)]
                txns += [dataclasses.replace(plan, start_ms=max(0, at_ms - 10 - 20 * number))
                         for number in range(6) for plan in writers[:1]]
            else:
                moves = (dataclasses.replace(moves[0], lapse_ms=lapse_ms), *moves[1:])
        if slow_move and not moves[0].after:
            moves = (dataclasses.replace(moves[0], after="read"), *moves[1:])
        on_it = [plan for plan in txns if partition in (p for p, _ in (*plan.writes, *plan.reads))]
        if gap_ms and on_it:
            # What a gap can hurt: a transaction whose only records are on the partition nobody
            # holds, and whose coordinator forgot it: it restarts once the first transaction there
            # may have committed, and its recovery ends about when the gap begins, so that the
            # status call asked then (StatusProbe.after_recovery) can read nothing that tells of it.
            crash_ms = max(on_it[0].start_ms + 40, at_ms - 250)
            crashes += (Crash(on_it[0].coordinator, crash_ms, 1 + (gap_draw >> 9) % 40),)
        # The transactions run again on the new owner, once it recovered the partition.
        txns += [dataclasses.replace(plan, start_ms=moves[0].at_ms + gap_ms + 300 + plan.start_ms // 4)
                 for plan in list(txns)]
    # And, when asked, one in eight starts a second process of a coordinator while the first one
    # still runs (a pod force-deleted while its process lived on), beside transactions the first
    # one coordinates and later ones of the second.
    twin_schedules: tuple[Twin, ...] = ()
    if twins and seed % 8 == 5:
        at_ms = 5 + (seed >> 4) % 300
        node = COORDINATORS[(seed >> 3) % 2]
        twin_schedules = (Twin(node, at_ms, min(1 + (seed >> 13) % 600, FAULTS_END_MS - at_ms)),)
        # What two processes can hurt is a decision the first one is still writing when the
        # second answers for the node: its coordinator log is unreachable for a while around the
        # second's start, and transactions of the first run into it.
        start_ms = max(0, at_ms - (seed >> 20) % 60)
        outages.append(Outage((f"c.{node}",), start_ms, min(FAULTS_END_MS, start_ms + 20 + (seed >> 23) % 300)))
        txns += [dataclasses.replace(plan, coordinator=node, start_ms=max(0, start_ms - 30 + plan.start_ms // 8))
                 for plan in list(txns)]
    elif twins and storage_cuts and seed % 8 == 7:
        # With `storage_cuts`, those schedules cut the first process off from storage alone
        # (Twin.storage_only), from a little before the second process starts (so that it never
        # hears its renewal refused) until after its identity went stale: one-shots for the node
        # reach it every 300 ms from 150 ms after the second's start, before and past the end of
        # its identity_learn_ms (some 1,000-1,160 ms after its last confirmation).
        node = COORDINATORS[(seed >> 3) % 2]
        draw = zlib.crc32(f"{seed}/storage-cut".encode())
        at_ms = 5 + (seed >> 4) % 300
        lead_ms = min(at_ms, draw % 40)
        cut_ms = lead_ms + 1_500 + (draw >> 8) % 300
        twin_schedules = (Twin(node, at_ms, cut_ms - lead_ms + 50 + (draw >> 16) % 200, -lead_ms, cut_ms,
                               storage_only=True),)
        writers = [plan for plan in txns if plan.writes]
        txns += [dataclasses.replace(writers[index % len(writers)], coordinator=node, one_shot=True,
                                     start_ms=at_ms + 150 + 300 * index) for index in range(5)]
    elif twins and seed % 8 == 7:
        # And one in eight (the schedules no other fault class takes: seed % 8 == 7) cuts
        # the first process of a second one off long enough for the second to commit and collect
        # the one-shots sent again to it (world.config_for: a grace of 400 ms there), and lets it
        # back before it dies. The cut comes once the second process is ready (its recovery
        # waits out calls of the first's, some 300 ms here), so that the client's second send is
        # taken. One-shots for the node reach the first process just before it, so that the cut
        # finds them running, and some a little earlier, so that they end before it and their
        # replies are lost in it (World._resend: their clients send them again too).
        node = COORDINATORS[(seed >> 3) % 2]
        draw = zlib.crc32(f"{seed}/cut-ms".encode())
        cut_after_ms, cut_ms = 320 + draw % 60, 500 + (draw >> 8) % 300
        twin = Twin(node, 5 + (seed >> 4) % 300, cut_after_ms + cut_ms + 50 + (draw >> 16) % 200, cut_after_ms, cut_ms)
        twin_schedules = (twin,)
        before_cut_ms = [1 + index % 3 if index % 2 else 30 + 40 * (index % 3) for index in range(4)]
        txns += [dataclasses.replace(plan, coordinator=node, one_shot=True, start_ms=twin.cut_start_ms - before)
                 for plan, before in zip(txns[:4], before_cut_ms, strict=False) if plan.writes]
    schedule = Schedule(
        seed=seed,
        partition_count=partition_count,
        txns=tuple(txns),
        loss_probability=rng.choice((0.0, 0.0, 0.05, 0.2)),
        delay_ms_max=rng.choice((2, 20, 60)),
        storage_ms_max=rng.choice((2, 10, 40)),
        ambiguous_probability=rng.choice((0.0, 0.5, 1.0)),
        late_call_probability=rng.choice((0.0, 0.0, 0.05, 0.2)),
        # One schedule in four runs on storage that takes calls late (not drawn from `rng`, so
        # the other schedules stay what they were): past any grace, up to a few seconds.
        late_window_ms=LATE_WINDOW_MS_MIN + zlib.crc32(f"{seed}/late".encode()) % LATE_WINDOW_MS_MIN
        if zlib.crc32(f"{seed}/late?".encode()) % 4 == 0 else 0,
        duplicate_probability=rng.choice((0.0, 0.0, 0.1, 0.3)),
        scan_page_max=rng.choice((1, 1, 2, 3, 500)),
        crashes=crashes,
        moves=moves,
        twins=twin_schedules,
        outages=tuple(outages),
        resolves=resolves,
        late_request_probability=0.3 if late else 0.0,
        late_request_ms=200 + seed % 400 if late else 0,
        # Half the schedules with late requests keep no deadline, so what a late request can do
        # when it runs is still explored.
        request_deadlines=not late or (seed >> 3) % 2 == 0,
        slow_read_probability=0.5 if slow_reads else 0.0,
        slow_read_ms=slow_read_ms if slow_reads else 0,
        think_ms=think_ms if thinking else 0,
        # One schedule in eight runs the other lock policy.
        wait_die=seed % 8 == 3,
        slow_identity=bool(twin_schedules) and not twin_schedules[0].cut_ms and (seed >> 26) % 2 == 0,
        # One schedule in four gives every node a clock of its own (not drawn from `rng` either).
        clock_offsets_ms=tuple(
            (name, _clock_offset_ms(seed, name)) for name in nodes
        ) if (seed >> 27) % 4 == 0 else (),
        # One in four runs a rollout (from a hash of the seed, as the late window: the other
        # schedules stay what they were).
        rollout=zlib.crc32(f"{seed}/rollout".encode()) % 4 == 0,
        short_scans=zlib.crc32(f"{seed}/scans".encode()) % 4 == 0,
        # One in four gives up terminating soon (a hash of the seed: the others stay as they were).
        terminate_limit_ms=1 + zlib.crc32(f"{seed}/give-up".encode()) % 400
        if zlib.crc32(f"{seed}/give-up?".encode()) % 4 == 0 else 0,
    )
    return with_sweeps(schedule) if sweeps else schedule


# How late a sweep schedule's late copies may come at most: past any age and keep it runs with
# (an age of the grace, its bound on terminations, two deadlines and the late window; a keep of the
# grace and the late window), and before its end.
LATE_COPY_MS_MAX = 12_000


def with_sweeps(schedule: Schedule) -> Schedule:
    """`schedule` with sweepers on every node (Schedule.sweep_interval_ms) and what they are for,
    drawn from a generator of the seed's own: half of those with no moves and no second processes
    kill a transaction's coordinator within its grace for good (Abandon: its records are left
    behind), and half of the others cut a coordinator off from storage alone for up to seconds
    (StorageCut: a Cornus coordinator terminating through it, back after its transaction was
    swept); some messages and one-shot requests come again after the sweeps (late copies); a
    quarter keep the decisions' tombstones as briefly as the configuration allows; and a quarter
    give the nodes a sweep budget low enough that their sweepers wait for it (drawn last: the
    draws before it are what they were)."""
    rng = random.Random(f"{schedule.seed}/sweeps")
    interval_ms = rng.choice((100, 200, 400))
    page_count_max, pages_per_pass_max = rng.choice(((1, 64), (2, 32), (3, 24), (100, 10)))
    abandons: tuple[Abandon, ...] = ()
    cuts: tuple[StorageCut, ...] = ()
    if not schedule.moves and not schedule.twins:
        if rng.random() < 0.5:
            abandons = (Abandon(rng.randrange(len(schedule.txns)), rng.randrange(0, 1_000)),)
        elif rng.random() < 0.5:
            start_ms = rng.randrange(0, 400)
            cuts = (StorageCut(rng.choice(COORDINATORS), start_ms, start_ms + rng.randrange(200, 8_000)),)
    late_copy_probability = rng.choice((0.0, 0.0, 0.05, 0.2))
    late_copy_ms = rng.randrange(1_000, LATE_COPY_MS_MAX) if late_copy_probability else 0
    short_keep = rng.random() < 0.25
    # 20 calls a second: a node's few sweepers, a pass each 100 to 400 ms, ask for more than that.
    calls_per_s_max = rng.choice((20, 200, 200, 200))
    return dataclasses.replace(
        schedule, sweep_interval_ms=interval_ms, sweep_page_count_max=page_count_max,
        sweep_pages_per_pass_max=pages_per_pass_max, abandons=abandons, storage_cuts=cuts,
        late_copy_ms=late_copy_ms, late_copy_probability=late_copy_probability, short_keep=short_keep,
        sweep_calls_per_s_max=calls_per_s_max,
    )
