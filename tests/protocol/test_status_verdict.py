"""The status call's verdict (cornus/protocol/status.py), branch by branch: above all, when it may
say "not known", which lets a caller run a transaction again."""

from __future__ import annotations

import dataclasses

import pytest

from cornus.protocol.config import ProtocolConfig
from cornus.protocol.status import (
    Known,
    NodeAnswer,
    Verdict,
    kept_floor_ms,
    kept_window_ms,
    node_knows,
    request_deadline_ms,
    request_expired,
    requests_window_ms,
    verdict,
)
from storage_adapters.contract import TxnState

CONFIG = ProtocolConfig()
REQUESTS_MS = 2_000 + CONFIG.clock_slack_ms
PARTITIONS = ("p0", "p1")
BEGIN_MS = 1_000_000
NOW_MS = BEGIN_MS + 60_000
VOTE, COMMIT, ABORT = TxnState.VOTE_YES, TxnState.COMMIT, TxnState.ABORT


def node(
    partitions: tuple[str, ...], *states: TxnState, known: Known = Known.NOTHING, ready: bool = True
) -> NodeAnswer:
    """A node's answer, with the windows of CONFIG, in force since before BEGIN_MS."""
    return NodeAnswer(ready, partitions, states, known, kept_ms=kept_window_ms(CONFIG), since_ms=BEGIN_MS - 1)


def judge(
    *answers: NodeAnswer | None, now_ms: int = NOW_MS, begin_ms: int = BEGIN_MS, answered_ms: int | None = None,
) -> Verdict | None:
    answered_ms = now_ms if answered_ms is None else answered_ms
    found = verdict(answers, PARTITIONS, begin_ms, now_ms, answered_ms, config=CONFIG, requests_ms=REQUESTS_MS,
                    coordinator="n1")
    return None if found is None else found.verdict


@pytest.mark.parametrize(("answers", "expected"), [
    ((node(("p0",), COMMIT), node(("p1",))), Verdict.COMMITTED),  # a tombstone, or a decided record
    ((node(("p0",), VOTE), node(("p1",), ABORT)), Verdict.ABORTED),
    ((node(("p0",), known=Known.COMMITTED), None), Verdict.COMMITTED),  # a coordinator's memory
    ((node(("p0",), known=Known.ACTIVE), node(("p1",))), Verdict.ACTIVE),
    ((node(("p0",), VOTE), node(("p1",))), Verdict.UNKNOWN),  # voted, undecided
    ((node(("p0",), known=Known.IN_DOUBT), node(("p1",))), Verdict.UNKNOWN),  # a commit under way
    ((node(("p0",), known=Known.of("unavailable")), node(("p1",))), Verdict.UNKNOWN),  # a word it does not know
    ((node(("p0",)), None), Verdict.UNKNOWN),  # a node did not answer
    ((node(("p0",)), node(("p1",), ready=False)), Verdict.UNKNOWN),  # still recovering
    ((node(("p0",)), node(())), Verdict.UNKNOWN),  # p1 between owners: its records not read
    ((node(("p0",)), node(("p1",))), None),  # every record read, nothing: it never voted
    # A process that aborted it (or still runs its operations) beside records that hold its COMMIT:
    # another process of the node, sent the same client-chosen id, committed it. The records tell
    # (found by audit, 2026-11-28: the memory was taken at its word).
    ((node(("p0",), COMMIT, known=Known.ABORTED), node(("p1",))), Verdict.COMMITTED),
    ((node(("p0",), known=Known.ACTIVE), node(("p1",), COMMIT)), Verdict.COMMITTED),
])
def test_a_verdict(answers: tuple[NodeAnswer | None, ...], expected: Verdict | None) -> None:
    assert judge(*answers) is expected


def test_not_known_only_while_a_tombstone_would_still_be_there() -> None:
    everyone = (node(("p0",)), node(("p1",)))
    kept_ms = CONFIG.gc_grace_ms + CONFIG.outcome_keep_ms - CONFIG.clock_slack_ms
    assert judge(*everyone, now_ms=BEGIN_MS + kept_ms - 1) is None
    assert judge(*everyone, now_ms=BEGIN_MS + kept_ms) is Verdict.UNKNOWN
    assert judge(*everyone, now_ms=BEGIN_MS + 10 * kept_ms, begin_ms=0) is None  # an id no runtime made


def test_not_known_only_once_no_request_of_it_can_still_run() -> None:
    """A one-shot whose coordinator died as its requests left has, while they travel, nothing
    anywhere to tell of it; they run at their owners until their deadline plus the slack."""
    everyone = (node(("p0",)), node(("p1",)))
    assert judge(*everyone, now_ms=BEGIN_MS + REQUESTS_MS - 1) is Verdict.UNKNOWN
    assert judge(*everyone, now_ms=BEGIN_MS + REQUESTS_MS) is None


@pytest.mark.parametrize(("remembered", "coordinating", "decision", "participating", "expected"), [
    (Known.NOTHING, False, None, False, Known.NOTHING),
    (Known.ACTIVE, False, None, False, Known.ACTIVE),
    (Known.ABORTED, True, None, True, Known.ABORTED),  # what it answered its caller stands
    (Known.NOTHING, True, COMMIT, False, Known.COMMITTED),
    (Known.IN_DOUBT, True, ABORT, False, Known.ABORTED),  # told UNKNOWN, decided since
    (Known.NOTHING, True, None, False, Known.IN_DOUBT),  # its commit runs here, undecided
    (Known.NOTHING, False, None, True, Known.IN_DOUBT),  # a participant here runs it
    (Known.IN_DOUBT, False, None, False, Known.IN_DOUBT),  # it told its caller UNKNOWN
])
def test_what_a_node_knows(
    remembered: Known, coordinating: bool, decision: TxnState | None, participating: bool, expected: Known,
) -> None:
    found = node_knows(remembered=remembered, coordinating=coordinating, decision=decision, participating=participating)
    assert found is expected


def test_a_decision_without_its_machine_is_impossible() -> None:
    with pytest.raises(AssertionError):
        node_knows(remembered=Known.NOTHING, coordinating=False, decision=COMMIT, participating=False)


def test_a_request_expires_after_its_deadline_and_the_slack_and_never_without_one() -> None:
    slack_ms = CONFIG.clock_slack_ms
    assert not request_expired(BEGIN_MS, BEGIN_MS + slack_ms, slack_ms)
    assert request_expired(BEGIN_MS, BEGIN_MS + slack_ms + 1, slack_ms)
    assert not request_expired(0, NOW_MS, slack_ms)  # an older coordinator's: no deadline
    # The asking node's window covers the owner's slack and its clock's: twice the slack.
    assert requests_window_ms(2_000, slack_ms) == 2_000 + 2 * slack_ms


def test_a_deadline_is_the_carried_one_and_never_later_than_the_owners_wait() -> None:
    assert request_deadline_ms(BEGIN_MS + 5_000, BEGIN_MS, 2_000) == BEGIN_MS + 2_000  # a longer carried wait
    assert request_deadline_ms(BEGIN_MS + 1_000, BEGIN_MS, 2_000) == BEGIN_MS + 1_000
    assert request_deadline_ms(0, BEGIN_MS, 2_000) == BEGIN_MS + 2_000  # an older coordinator carries none
    assert request_deadline_ms(BEGIN_MS, 0, 2_000) == BEGIN_MS  # an id no runtime made: the carried one
    assert request_deadline_ms(0, 0, 2_000) == 0  # nothing to keep it to


def test_the_peers_windows_widen_the_askers() -> None:
    """Found by audit: the asking node judged by its own configuration alone, while the
    transaction's coordinator (whose requests' deadline and tombstone's keep count) or a
    request's owner may run with another during a change of configuration."""
    longer_wait = dataclasses.replace(node(("p1",)), requests_ms=REQUESTS_MS + 5_000)
    assert judge(node(("p0",)), longer_wait, now_ms=BEGIN_MS + REQUESTS_MS + 4_999) is Verdict.UNKNOWN
    assert judge(node(("p0",)), longer_wait, now_ms=BEGIN_MS + REQUESTS_MS + 5_000) is None
    kept_ms = kept_window_ms(CONFIG)
    shorter_keep = dataclasses.replace(node(("p1",)), kept_ms=kept_ms - 1_000)
    assert judge(node(("p0",)), shorter_keep, now_ms=BEGIN_MS + kept_ms - 1_001) is None
    assert judge(node(("p0",)), shorter_keep, now_ms=BEGIN_MS + kept_ms - 1_000) is Verdict.UNKNOWN
    told_nothing = dataclasses.replace(node(("p1",)), requests_ms=0)  # the asker's wait stands
    assert judge(node(("p0",)), told_nothing, now_ms=BEGIN_MS + REQUESTS_MS) is None


def test_a_tombstone_counts_until_the_last_answer_came() -> None:
    """Found by review: "kept" was judged by the clock read before asking, while a node reads its
    records as late as its answer comes (up to a peer request's deadline), by when the tombstone
    it looked for may have expired: "not known" of a committed transaction."""
    everyone = (node(("p0",)), node(("p1",)))
    kept_ms = kept_window_ms(CONFIG)
    assert judge(*everyone, now_ms=BEGIN_MS + kept_ms - 1, answered_ms=BEGIN_MS + kept_ms - 1) is None
    assert judge(*everyone, now_ms=BEGIN_MS + kept_ms - 1, answered_ms=BEGIN_MS + kept_ms) is Verdict.UNKNOWN
    # And "too recent" by the clock read before any answer: a request may have run until then.
    assert judge(*everyone, now_ms=BEGIN_MS + REQUESTS_MS - 1, answered_ms=BEGIN_MS + REQUESTS_MS) is Verdict.UNKNOWN


def test_a_coordinator_started_since_the_begin_counts_for_the_floor_only() -> None:
    """Found by review: the windows were the nodes' configurations now, while a transaction's
    tombstone keeps the outcome_keep_ms its coordinator ran with when it collected it. A rollout
    that raised the keep made the status call count on a tombstone collected, and dropped, under
    the old one: "not known" of a committed transaction. A coordinator whose process (and
    configuration) began after the transaction is counted for what any configuration keeps."""
    kept_ms, floor_ms = kept_window_ms(CONFIG), kept_floor_ms(CONFIG)
    assert floor_ms < kept_ms
    restarted = dataclasses.replace(node(("p1",)), node="n1", since_ms=BEGIN_MS + 1)  # the coordinator (judge)
    assert judge(node(("p0",)), restarted, now_ms=BEGIN_MS + floor_ms - 1) is None
    assert judge(node(("p0",)), restarted, now_ms=BEGIN_MS + floor_ms) is Verdict.UNKNOWN
    running = dataclasses.replace(restarted, since_ms=BEGIN_MS)
    assert judge(node(("p0",)), running, now_ms=BEGIN_MS + kept_ms - 1) is None
    older = NodeAnswer(True, ("p1",), (), Known.NOTHING, node="n1")  # an older node tells no since
    assert judge(node(("p0",)), older, now_ms=BEGIN_MS + floor_ms) is Verdict.UNKNOWN
    # Any other node's restart, or a coordinator gone from the cluster, changes nothing.
    other = dataclasses.replace(restarted, node="n2")
    assert judge(node(("p0",)), other, now_ms=BEGIN_MS + kept_ms - 1) is None


def test_only_a_commit_in_memory_answers_for_a_client_chosen_id_without_records() -> None:
    """The asked node's memory is the outcome, no record read, for every outcome of an id it made,
    and only for COMMITTED of a client-chosen id (found by audit, 2026-11-28: another process of
    the node, sent the same id, may have committed what this one remembers aborted)."""
    from cornus.protocol.status import memory_is_outcome

    for known in (Known.COMMITTED, Known.ABORTED, Known.ACTIVE):
        assert memory_is_outcome(known, client_chosen=False)
    assert memory_is_outcome(Known.COMMITTED, client_chosen=True)
    for known in (Known.ABORTED, Known.ACTIVE, Known.IN_DOUBT, Known.NOTHING):
        assert not memory_is_outcome(known, client_chosen=True)
    assert not memory_is_outcome(Known.IN_DOUBT, client_chosen=False)


def test_a_coordinator_back_within_a_minute_still_lets_a_one_shot_that_never_landed_be_not_known() -> None:
    """Found by review (2026-11-28): a one-shot whose coordinator died as its requests left, and
    came back 30 s later, stayed UNKNOWN for good: a coordinator process that started after the
    begin was counted for the least any configuration keeps, which was the smallest grace (10 s
    here), so the status call could say "not known" (run it again) only in the 6 s between the
    requests' window and that floor. No node runs with outcome_keep_ms under OUTCOME_KEEP_MS_FLOOR
    (the runtime refuses it), so the floor counts that too."""
    from cornus.protocol.config import OUTCOME_KEEP_MS_FLOOR

    assert kept_floor_ms(CONFIG) >= OUTCOME_KEEP_MS_FLOOR
    restarted = dataclasses.replace(node(("p1",)), node="n1", since_ms=BEGIN_MS + 30_000)
    assert judge(node(("p0",)), restarted, now_ms=BEGIN_MS + 40_000) is None
    assert judge(node(("p0",)), restarted, now_ms=BEGIN_MS + kept_floor_ms(CONFIG)) is Verdict.UNKNOWN
