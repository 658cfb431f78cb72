"""Rules the runtime and the simulator share since an audit found their copies had drifted or
were missing: which owner's answer is a refusal (cornus/protocol/owner_answer.py), and that a
one-shot's late vote meets its transaction's tombstone (cornus/protocol/status.py)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from cornus.protocol.config import Protocol, gc_grace_ms_min
from cornus.protocol.owner_answer import ExecuteStatus, refuses
from cornus.sim import execution_phase, world
from cornus.sim.schedule import random_schedule


def test_only_an_answer_of_an_owner_that_did_not_run_the_request_is_a_refusal() -> None:
    assert [status for status in ExecuteStatus if not refuses(status)] == [ExecuteStatus.OK, ExecuteStatus.ABORTED]


def test_the_runtime_and_the_simulator_read_answers_with_the_same_statuses() -> None:
    # The runtime answers a request dropped while its read was out ABORTED (PartitionRuntime.execute):
    # no refusal there, and none in the world any more.
    assert not refuses(execution_phase._STATUS_OF_ANSWER["aborted while reading"])
    assert not refuses(execution_phase._STATUS_OF_ANSWER[execution_phase.ALREADY_COMMITTING])
    assert refuses(execution_phase._STATUS_OF_ANSWER["not ready"])


def test_the_simulator_explores_no_configuration_the_runtime_refuses_for_late_votes() -> None:
    """Found by audit: the runtime refused a configuration whose one-shot votes could land after
    their transaction's tombstone was dropped, and the world never checked its own."""
    schedule = random_schedule(random.Random(7), Protocol.CORNUS)
    world.World(schedule)  # its own configuration meets the rule
    base = world.config_for(schedule)
    short_keep = dataclasses.replace(base, gc_grace_ms=gc_grace_ms_min(base.storage_deadline_ms, base.clock_slack_ms),
                                     outcome_keep_ms=1)
    with pytest.raises(AssertionError, match="tombstone"):
        world.World(schedule, config=short_keep)
