"""The ownership machine: its rules one by one, and the ownership world's schedules, which must
find no two owners of a partition at once, and must find them when a rule is broken."""

from __future__ import annotations

import dataclasses

import pytest

from cornus.protocol.effects import ApplyRedo, DeleteRecord, Log, LogOnce, ReadRecord
from cornus.protocol.ownership import (
    RELEASE_RETRY_COUNT_MAX,
    Acquired,
    Drain,
    Lost,
    LostReason,
    OwnershipConfig,
    OwnershipMachine,
    ReadOwners,
    WriteOwner,
    fenced_partition,
    placement,
)
from cornus.runtime.config import NodeConfig
from cornus.sim import ownership_world
from storage_adapters.contract import LogId, Ownership, OwnerWriteResult, RecordBody, TxnState

CONFIG = ownership_world.CONFIG


def _read(machine: OwnershipMachine, now_ms: int, records: dict[str, Ownership]) -> list[object]:
    effects = machine.tick(now_ms)
    assert any(isinstance(e, ReadOwners) for e in effects)
    return [e for e in effects if not isinstance(e, ReadOwners)] + machine.owners_read(now_ms, records)


def _write(machine: OwnershipMachine, now_ms: int, call: WriteOwner, records: dict[str, Ownership]) -> list[object]:
    stored = records.get(call.new.partition)
    expected = call.expected
    ok = stored is None if expected is None else stored is not None and stored.version == expected.version
    if ok:
        records[call.new.partition] = call.new
    return machine.owner_written(now_ms, call, OwnerWriteResult(records.get(call.new.partition), ok))


def test_preferred_node_takes_a_fresh_partition_and_holds_it_by_renewing() -> None:
    records: dict[str, Ownership] = {}
    machine = OwnershipMachine("n0", {"p0": "n0"}, CONFIG)
    (take,) = _read(machine, 0, records)
    assert isinstance(take, WriteOwner) and take.expected is None and take.new.epoch == 1
    (acquired,) = _write(machine, 5, take, records)
    assert isinstance(acquired, Acquired) and machine.admits("p0", 5)
    now = 0
    for _ in range(10):
        now += CONFIG.renew_interval_ms
        (renew,) = _read(machine, now, records)
        assert isinstance(renew, WriteOwner) and renew.new.epoch == 1
        assert _write(machine, now + 5, renew, records) == []
    assert machine.holds("p0", now + CONFIG.lease_ms - 1)
    # Renewals stop landing: the lease ends by the holder's own clock, counted from the last send.
    effects = machine.tick(now + CONFIG.lease_ms)
    assert effects[0] == Lost("p0", 1, LostReason.EXPIRED, now + CONFIG.lease_ms)


def test_another_node_waits_lease_and_slack_after_the_record_stops_changing() -> None:
    records = {"p0": Ownership("p0", "n1", 3, 7, CONFIG.lease_ms)}
    machine = OwnershipMachine("n0", {"p0": "n0"}, CONFIG)
    # Preferred, and the holder is alive as far as it knows: it asks for the partition.
    (ask,) = _read(machine, 1000, records)
    assert isinstance(ask, WriteOwner) and ask.new.wanted_by == "n0" and ask.new.owner == "n1"
    assert _write(machine, 1001, ask, records) == []
    # The holder writes nothing more (it died). The first read after our request sees it unchanged.
    now = 1000
    for _ in range(100):
        now += CONFIG.renew_interval_ms
        effects = _read(machine, now, records)
        if effects:
            break
    (take,) = effects
    assert now >= 1100 + CONFIG.lease_ms + CONFIG.clock_slack_ms, f"took at {now}, before the lease and slack passed"
    assert isinstance(take, WriteOwner) and take.new.owner == "n0" and take.new.epoch == 4 and take.expected == ask.new


def test_a_holder_that_is_not_preferred_drains_and_releases_when_asked() -> None:
    records: dict[str, Ownership] = {}
    holder = OwnershipMachine("n1", {"p0": "n0"}, CONFIG)
    holder.tick(0)
    assert holder.owners_read(0, records) == []  # not preferred: waits the failover delay
    now = max(CONFIG.failover_delay_ms, CONFIG.renew_interval_ms)
    holder.tick(now)
    (take,) = holder.owners_read(now, records)
    assert isinstance(_write(holder, now, take, records)[0], Acquired)
    records["p0"] = Ownership("p0", "n1", 1, 2, CONFIG.lease_ms, wanted_by="n0")
    now += CONFIG.renew_interval_ms
    drain, renew = _read(holder, now, records)
    assert drain == Drain("p0") and not holder.admits("p0", now) and holder.holds("p0", now)
    _write(holder, now, renew, records)
    lost, release = holder.drained(now + 1, "p0")
    assert lost == Lost("p0", 1, LostReason.RELEASED, now + 1)
    assert isinstance(release, WriteOwner) and release.new.owner == "" and release.new.wanted_by == "n0"


def test_two_nodes_that_both_prefer_a_dead_owner_s_partition_do_not_ask_each_other_out_of_it() -> None:
    """Found by review: the owner died holding p, and two nodes both preferred it (their
    configurations disagree during a rollout). Each asked for p over the other's request, every
    ask raised the record's version, and the record never stayed unchanged for a lease: nobody took
    p, for as long as the configurations disagreed. A node asks only when nobody has."""
    records = {"p": Ownership("p", "x", 1, 1, CONFIG.lease_ms)}  # x died holding p
    machines = [OwnershipMachine(node, {"p": node}, CONFIG) for node in ("a", "b")]
    asks_over_another = 0
    for now in range(0, 60_000, 250):
        machine = machines[(now // 250) % 2]
        pending = list(machine.tick(now))
        while pending:
            effect = pending.pop(0)
            if isinstance(effect, ReadOwners):
                pending += machine.owners_read(now, dict(records))
            elif isinstance(effect, WriteOwner):
                stored = records.get("p")
                asks_over_another += (effect.new.wanted_by == machine.node and stored is not None
                                      and stored.wanted_by not in ("", machine.node))
                pending += _write(machine, now, effect, records)
    holders = [machine.node for machine in machines if "p" in machine.held]
    assert len(holders) == 1, (holders, records["p"])
    assert asks_over_another == 0


def _holding_another_s_partition() -> tuple[OwnershipMachine, WriteOwner]:
    """Node a, holding p (b's preferred partition, free for a to take after 5 s), and its take."""
    machine = OwnershipMachine("a", {"p": "b"}, OwnershipConfig())
    machine.tick(0)
    assert machine.owners_read(0, {}) == []
    machine.tick(5_000)
    (take,) = machine.owners_read(5_000, {})
    machine.owner_written(5_001, take, OwnerWriteResult(take.new, True))
    return machine, take


def test_a_release_deferred_behind_a_renewal_is_written_though_an_ask_won_the_race() -> None:
    """Found by review: a stop's release waits for the renewal in flight; when that renewal lost
    its compare-and-swap to another node's ask, the release was dropped though the record still
    named this node in its epoch, and the asker waited out the lease (a rolling restart is meant
    to move nothing by lease expiry)."""
    machine, take = _holding_another_s_partition()
    machine.tick(6_000)
    (renew,) = machine.owners_read(6_000, {"p": take.new})
    assert not [e for e in machine.shutdown(6_001) if isinstance(e, WriteOwner)]  # deferred behind the renewal
    asked = Ownership("p", "a", 1, 2, OwnershipConfig().lease_ms, wanted_by="b")  # b's ask landed first
    (release,) = machine.owner_written(6_002, renew, OwnerWriteResult(asked, False))
    assert isinstance(release, WriteOwner) and release.expected == asked and release.new.owner == ""


def test_a_release_that_loses_its_compare_and_swap_to_an_ask_is_written_again() -> None:
    """Found by audit (2026-11-27): a release (a stop's, or a drain's) written in the same instant
    as the preferred node's ask lost its compare-and-swap and was dropped, though the record still
    named this node in its epoch: the asker waited out the lease and the slack instead of taking
    the partition at once (the renewal-in-flight case above had the fix; the plain release not)."""
    machine, take = _holding_another_s_partition()
    (release,) = [e for e in machine.shutdown(5_002) if isinstance(e, WriteOwner)]
    asked = dataclasses.replace(take.new, version=take.new.version + 1, wanted_by="b")  # b's ask landed first
    (again,) = machine.owner_written(5_003, release, OwnerWriteResult(asked, False))
    assert isinstance(again, WriteOwner) and again.expected == asked and again.new.owner == ""
    # Bounded: a release that keeps losing gives up (the asker then waits out the lease).
    for _ in range(100):
        asked = dataclasses.replace(asked, version=asked.version + 1)
        answer = machine.owner_written(5_004, again, OwnerWriteResult(asked, False))
        if not answer:
            break
        (again,) = answer
    assert not answer


def test_a_take_that_lands_after_the_stop_is_released() -> None:
    """Found by review: a take in flight when the node stopped landed and was never released: the
    record named a stopped node until its lease ran out."""
    machine = OwnershipMachine("a", {"p": "a"}, OwnershipConfig())
    machine.tick(0)
    (take,) = machine.owners_read(0, {})
    machine.shutdown(1)
    (release,) = machine.owner_written(2, take, OwnerWriteResult(take.new, True))
    assert isinstance(release, WriteOwner) and release.expected == take.new and release.new.owner == ""
    assert "p" not in machine.held


def test_a_fenced_write_ends_the_lease_at_once() -> None:
    records: dict[str, Ownership] = {}
    machine = OwnershipMachine("n0", {"p0": "n0"}, CONFIG)
    (take,) = _read(machine, 0, records)
    _write(machine, 1, take, records)
    assert machine.fenced(2, "p0", epoch=1) == [Lost("p0", 1, LostReason.FENCED, 2)]
    assert not machine.holds("p0", 3)


def test_ownership_world_finds_no_two_owners_at_once() -> None:
    ran, totals = ownership_world.explore(400, seed=7)
    assert totals["violations"] == 0 and ran == 400
    assert totals["takes"] > 400 and totals["pauses"] > 0 and totals["crashes"] > 0 and totals["isolations"] > 0


@pytest.mark.parametrize("broken", ["taker_skips_the_lease", "lease_counted_from_the_answer"])
def test_ownership_world_finds_a_broken_rule(broken: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if broken == "taker_skips_the_lease":
        observe = OwnershipMachine._observe

        def hasty(self: OwnershipMachine, partition: str, record: Ownership | None, now_ms: int) -> object:
            watch = observe(self, partition, record, now_ms)
            watch.since_ms = min(watch.since_ms, now_ms - CONFIG.lease_ms * 3 // 4)
            return watch

        monkeypatch.setattr(OwnershipMachine, "_observe", hasty)
    else:
        written = OwnershipMachine.owner_written

        def from_answer(self: OwnershipMachine, now_ms: int, call: WriteOwner, result: object) -> list[object]:
            effects = written(self, now_ms, call, result)  # type: ignore[arg-type]
            held = self.held.get(call.new.partition)
            if held is not None and result is not None:
                # As if a lease counted from when the renewal's answer came back, not when it left.
                held.valid_until_ms = max(held.valid_until_ms, now_ms + CONFIG.lease_ms)
            return effects

        monkeypatch.setattr(OwnershipMachine, "owner_written", from_answer)
    # Seeds where the search meets each within the bound (since asks retry at once after losing
    # to a renewal, fewer partitions change hands by expiry, and seed 7 no longer meets the first;
    # since a read served after a renewal renews again (2026-11-28), records change more often
    # and a hasty taker meets a held lease less: 2 seeds of 1-15 within 2,000 schedules, 6 and 13;
    # since a holder renews on its own when reads lag (2026-11-28, second), its renewals that land
    # unanswered, in an isolation, keep the record changing, and a taker that skips half the lease
    # met none in 2,000 schedules of 64 seeds; one that skips three quarters meets one within 160
    # in each of seeds 1-11).
    seed = 1 if broken == "taker_skips_the_lease" else 7
    ran, totals = ownership_world.explore(2000, seed=seed)
    assert totals["violations"] == 1, f"{broken}: not found in {ran} schedules"


def test_a_host_s_writes_to_its_own_log_and_data_carry_its_fence() -> None:
    body = RecordBody(("p0", "p1"), "n0", b"")
    assert fenced_partition(LogOnce("p0", LogId.partition("p0"), "t", TxnState.VOTE_YES, body)) == "p0"
    assert fenced_partition(Log("p0", LogId.partition("p0"), "t", TxnState.COMMIT)) == "p0"
    assert fenced_partition(DeleteRecord("p0", LogId.partition("p0"), "t")) == "p0"
    assert fenced_partition(ApplyRedo("p0", "p0", "t", b"")) == "p0"
    # A coordinator's writes to its own log carry its node's identity fence.
    assert fenced_partition(Log("n0", LogId.coordinator("n0"), "t", TxnState.COMMIT)) == "node:n0"
    assert fenced_partition(LogOnce("n0", LogId.coordinator("n0"), "t", TxnState.VOTE_YES, body)) == "node:n0"
    assert fenced_partition(DeleteRecord("n0", LogId.coordinator("n0"), "t")) == "node:n0"
    # Termination's LogOnce(ABORT) on another partition's log, and writes to another's log: anyone's.
    assert fenced_partition(LogOnce("p0", LogId.partition("p1"), "t", TxnState.ABORT, body)) is None
    assert fenced_partition(LogOnce("p0", LogId.coordinator("n0"), "t", TxnState.ABORT, body)) is None
    assert fenced_partition(Log("n1", LogId.coordinator("n0"), "t", TxnState.COMMIT)) is None
    assert fenced_partition(ReadRecord("p0", LogId.partition("p0"), "t")) is None


def test_placement_is_round_robin_over_sorted_node_ids_unless_configured() -> None:
    partitions = [f"p{index}" for index in range(5)]
    # Sorted as strings, whatever order the node set comes in: every node computes the same.
    assert placement(partitions, ["n2", "n10", "n1"], {}) == {
        "p0": "n1", "p1": "n10", "p2": "n2", "p3": "n1", "p4": "n10"}
    assert placement(partitions, {"a": "x", "b": "y"}, {"p0": "b", "p1": "b"}) == {
        "p0": "b", "p1": "b", "p2": "a", "p3": "b", "p4": "a"}
    with pytest.raises(AssertionError):
        placement(partitions, [], {})


def test_a_node_places_its_partitions_with_the_core_rule() -> None:
    config = NodeConfig(node_id="n1", peers={f"n{i}": f"127.0.0.1:{7000 + i}" for i in range(3)}, partition_count=7,
                        partition_owners={"p6": "n0"})
    expected = placement(config.partitions, config.peers, config.partition_owners)
    assert config.placement() == expected
    assert [config.preferred_owner(p) for p in config.partitions] == [expected[p] for p in config.partitions]
    assert config.preferred_partitions == ("p1", "p4")


def test_a_quiesced_node_renews_what_it_holds_and_neither_takes_nor_asks() -> None:
    """Found by audit (2026-11-27): a node told to stop asked for and took partitions until its
    node's own stop, after the API's shutdown (over 10 s): its preferred partition, held by a
    failover owner, was drained there, taken and recovered here, and released seconds later, to
    be taken by a non-preferred node only after failover_delay_ms. Quiesced (from the signal),
    it keeps what it holds and takes nothing."""
    records = {"p1": Ownership("p1", "n1", 3, 7, CONFIG.lease_ms)}
    machine = OwnershipMachine("n0", {"p0": "n0", "p1": "n0"}, CONFIG)
    (take, ask) = _read(machine, 0, records)
    assert isinstance(take, WriteOwner) and take.new.partition == "p0"
    assert isinstance(ask, WriteOwner) and ask.new.wanted_by == "n0"
    _write(machine, 5, take, records)
    _write(machine, 5, ask, records)
    assert machine.holds("p0", 5)
    del records["p1"]  # its holder released it: free for the preferred node
    machine.quiesce()
    effects = _read(machine, CONFIG.renew_interval_ms, records)
    writes = [e for e in effects if isinstance(e, WriteOwner)]
    assert [(w.new.partition, w.new.owner, w.new.epoch) for w in writes] == [("p0", "n0", 1)], writes


def test_a_release_storage_did_not_answer_is_written_again() -> None:
    """Found by audit (2026-11-27): a release whose write got no answer (a storage blip) was
    dropped; if it had not landed, the record still named this node, and the node that asked for
    the partition waited out the lease and the slack, several seconds unserved instead of one
    poll. Written again (a compare-and-swap on the same record, so a first write that did land
    makes it a no-op), at most RELEASE_RETRY_COUNT_MAX times a tenure."""
    records: dict[str, Ownership] = {}
    machine = OwnershipMachine("n0", {"p0": "n0"}, CONFIG)
    (take,) = _read(machine, 0, records)
    _write(machine, 5, take, records)
    released = [e for e in machine.shutdown(10) if isinstance(e, WriteOwner)]
    for attempt in range(1 + RELEASE_RETRY_COUNT_MAX):  # the release, then its retries
        (release,) = released
        assert release.new.owner == "" and release.expected == records["p0"], release
        released = [e for e in machine.owner_written(20 + attempt, release, None) if isinstance(e, WriteOwner)]
    assert released == [], "written again past the bound"


def test_a_release_queued_behind_a_renewal_storage_did_not_answer_is_written() -> None:
    """Found by audit (2026-11-27): a release waiting for a renewal in flight (a stop, or a drain's
    end) was dropped when that renewal got no answer: the asker, or the next node of a rolling
    stop, waited out the lease and the slack. The release is written over the record the renewal
    expected (if the renewal landed after all, that swap loses, and the lost-swap path frees it)."""
    records: dict[str, Ownership] = {}
    machine = OwnershipMachine("n0", {"p0": "n0"}, CONFIG)
    (take,) = _read(machine, 0, records)
    _write(machine, 5, take, records)
    (renew,) = _read(machine, CONFIG.renew_interval_ms, records)  # in flight when the stop comes
    assert not [e for e in machine.shutdown(CONFIG.renew_interval_ms + 1) if isinstance(e, WriteOwner)]
    (release,) = [e for e in machine.owner_written(CONFIG.renew_interval_ms + 2, renew, None)
                  if isinstance(e, WriteOwner)]
    assert release.new.owner == "" and release.expected == renew.expected, release


def test_a_draining_partition_admits_only_what_continues_an_execution_running_there() -> None:
    """The rule Node.on_request asks (found by audit: a drain refused its in-flight transactions,
    which it waits for); the in-process cluster test is tests/runtime/test_hand_over.py."""
    records: dict[str, Ownership] = {}
    machine = OwnershipMachine("n0", {"p0": "n1"}, CONFIG)  # n1 prefers it: n0 takes it on failover
    assert _read(machine, 0, records) == []
    now = max(CONFIG.failover_delay_ms, CONFIG.renew_interval_ms)  # a read after the failover delay
    (take,) = _read(machine, now, records)
    _write(machine, now + 1, take, records)
    assert machine.admits_request("p0", now + 2, continues_execution=False)
    records["p0"] = dataclasses.replace(records["p0"], wanted_by="n1")  # the preferred node asks
    now += CONFIG.renew_interval_ms
    assert any(isinstance(e, Drain) for e in _read(machine, now, records))
    assert not machine.admits_request("p0", now + 1, continues_execution=False)
    assert machine.admits_request("p0", now + 1, continues_execution=True)
    assert not machine.admits_request("p0", now + CONFIG.lease_ms + 1, continues_execution=True), "lease over"


def test_a_read_that_left_before_a_take_answered_does_not_drop_what_the_take_won() -> None:
    """Found by audit (2026-11-28): a read skipped only partitions with a write still in flight.
    One that left while a take was in flight, and answered after the take, showed the record from
    before the take, and the new holder dropped the partition as taken by another: unowned then
    for a lease and its slack (slow storage, a cluster starting, where every node takes at once)."""
    records: dict[str, Ownership] = {}
    machine = OwnershipMachine("n0", {"p0": "n0"}, CONFIG)
    (take,) = _read(machine, 0, records)
    assert isinstance(take, WriteOwner)
    before_take = dict(records)  # what a read served before the take landed shows
    # The next read leaves while the take is still on its way.
    assert any(isinstance(e, ReadOwners) for e in machine.tick(CONFIG.renew_interval_ms))
    (acquired,) = _write(machine, CONFIG.renew_interval_ms + 5, take, records)
    assert isinstance(acquired, Acquired)
    # The read was served before the take landed, and answers after its answer.
    assert machine.owners_read(CONFIG.renew_interval_ms + 6, before_take) == []
    assert machine.holds("p0", CONFIG.renew_interval_ms + 6)
    # The next read, which left after the take's answer, is taken at its word.
    now = 2 * CONFIG.renew_interval_ms
    (renew,) = _read(machine, now, records)
    assert isinstance(renew, WriteOwner) and renew.new.owner == "n0"


def test_a_take_that_lands_after_the_node_was_told_to_stop_is_released() -> None:
    """Found by audit (2026-11-28): only a take landing after the stop itself was released; one
    landing after the signal (quiesce) made the stopping node recover the partition, and release it
    seconds later, which the quiesce was meant to spare."""
    machine = OwnershipMachine("a", {"p": "a"}, OwnershipConfig())
    machine.tick(0)
    (take,) = machine.owners_read(0, {})
    machine.quiesce()
    (release,) = machine.owner_written(2, take, OwnerWriteResult(take.new, True))
    assert isinstance(release, WriteOwner) and release.expected == take.new and release.new.owner == ""
    assert "p" not in machine.held


def test_a_node_told_to_stop_does_not_ask_again_after_its_ask_lost() -> None:
    """Found by audit (2026-11-28): an ask that lost its compare-and-swap was retried at once
    whatever the node's state: a stopping node won it, and its owner drained and released the
    partition to a node that would not take it (unowned then for failover_delay_ms)."""
    records = {"p": Ownership("p", "b", 3, 7, CONFIG.lease_ms)}
    machine = OwnershipMachine("a", {"p": "a"}, CONFIG)
    (ask,) = _read(machine, 1_000, records)
    assert isinstance(ask, WriteOwner) and ask.new.wanted_by == "a"
    records["p"] = Ownership("p", "b", 3, 8, CONFIG.lease_ms)  # the owner renewed meanwhile
    machine.quiesce()
    assert _write(machine, 1_001, ask, records) == []


def _lapses_under_slow_storage(latency_ms_min: int, latency_ms_max: int, seed: int, run_ms: int) -> list[Lost]:
    """One node holding its one partition alone, on storage whose calls each take a latency drawn
    in [min, max], land at a point drawn within it, and always answer; ticked every half renewal
    interval as the runtime ticks it (cornus.runtime.ownership). The Lost effects it produced."""
    import heapq
    import random

    rng = random.Random(seed)
    config = OwnershipConfig()
    machine = OwnershipMachine("n0", {"p0": "n0"}, config)
    records: dict[str, Ownership] = {}
    events: list[tuple[int, int, str, object]] = []
    order = 0
    lost: list[Lost] = []

    def push(at_ms: int, kind: str, payload: object) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (at_ms, order, kind, payload))

    def carry_out(now_ms: int, effects: list[object]) -> None:
        for effect in effects:
            if isinstance(effect, Lost):
                lost.append(effect)
            elif isinstance(effect, ReadOwners | WriteOwner):
                total_ms = rng.randint(latency_ms_min, latency_ms_max)
                push(now_ms + rng.randint(0, total_ms), "land", (effect, now_ms + total_ms))

    for tick_ms in range(0, run_ms, config.renew_interval_ms // 2):
        push(tick_ms, "tick", None)
    while events:
        now_ms, _, kind, payload = heapq.heappop(events)
        if now_ms >= run_ms:
            break  # on slow storage each renewal's answer sends the next: they never run out
        if kind == "tick":
            carry_out(now_ms, machine.tick(now_ms))
        elif kind == "land":
            call, answer_ms = payload
            if isinstance(call, ReadOwners):
                push(answer_ms, "answer", (call, dict(records)))
            else:
                stored = records.get(call.new.partition)
                ok = stored == call.expected
                if ok:
                    records[call.new.partition] = call.new
                push(answer_ms, "answer", (call, OwnerWriteResult(records.get(call.new.partition), ok)))
        else:
            call, answer = payload
            if isinstance(call, ReadOwners):
                carry_out(now_ms, machine.owners_read(now_ms, answer))
            else:
                carry_out(now_ms, machine.owner_written(now_ms, call, answer))
    return lost


def test_a_holder_keeps_its_lease_while_storage_answers_within_half_of_it() -> None:
    """Found by audit (2026-11-28, second): an owner renewed only when a poll read answered, and
    skipped a read that answered while its last renewal was out; so a renewal left about every
    write, wait for the tick, and read, each slow. With calls of 200 to 1,800 ms (the default
    lease is 4 s, the storage deadline 5 s) a lone owner lost its lease to nobody five times in
    300 s, each time dropping every transaction on the partition and serving nothing for lease,
    slack and recovery (about 12 s). Renewals now leave on their own schedule, as soon as the
    last one answered once renew_interval_ms has passed since it left."""
    for seed in range(3):
        lost = _lapses_under_slow_storage(200, 1_800, seed, 300_000)
        assert lost == [], f"seed {seed}: {len(lost)} leases lapsed, the first {lost[:1]}"
