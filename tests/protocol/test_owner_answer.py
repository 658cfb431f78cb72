"""The one rule that reads an owner's answer to a request of the execution phase
(cornus/protocol/owner_answer.py), shared by the runtime and the simulator since an audit found
their copies had drifted."""

from __future__ import annotations

from cornus.protocol.owner_answer import ExecuteStatus, refuses
from cornus.runtime import wire
from cornus.sim import world


def test_only_an_answer_of_an_owner_that_did_not_run_the_request_is_a_refusal() -> None:
    assert [status for status in ExecuteStatus if not refuses(status)] == [ExecuteStatus.OK, ExecuteStatus.ABORTED]


def test_the_runtime_and_the_simulator_read_answers_with_the_same_statuses() -> None:
    assert wire.ExecuteStatus is ExecuteStatus
    # The runtime answers a request dropped while its read was out ABORTED (PartitionRuntime.execute):
    # no refusal there, and none in the world any more.
    assert not refuses(world._STATUS_OF_ANSWER["aborted while reading"])
    assert not refuses(world._STATUS_OF_ANSWER[world.ALREADY_COMMITTING])
    assert refuses(world._STATUS_OF_ANSWER["not ready"])
