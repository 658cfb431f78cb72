"""An owner's answer that says OK but carries a value count other than the request's reads: an
answer lost, never an exception after the transaction committed.

Found by audit (2026-11-27): the coordinator indexed the values by the request's reads, so an
answer with too few (a peer of another version, a bug, or a forged frame) raised IndexError: after
a one-shot had committed, its client heard a server error, and may have run it again.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from cornus.protocol.events import ExecuteFailed
from cornus.runtime.coordination import TxnAborted
from cornus.runtime.outcome import AbortReason, OutcomeStatus
from cornus.runtime.wire import ExecuteResponse, Op, OpKind, PeerRequest, PeerResponse
from tests.runtime.faults import local_cluster

pytestmark = pytest.mark.timeout(60)


class DroppingValues:
    """n1's inbound handler, answering every OK execute request with one value fewer."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.dropped_count = 0

    def on_message(self, sender: str, message: Any) -> None:
        self.inner.on_message(sender, message)

    async def on_request(self, sender: str, request: PeerRequest) -> PeerResponse:
        response = await self.inner.on_request(sender, request)
        if isinstance(response, ExecuteResponse) and response.values:
            self.dropped_count += 1
            return dataclasses.replace(response, values=response.values[:-1])
        return response


async def test_a_one_shot_whose_owner_answers_too_few_values_is_unknown_not_an_error(tmp_path):
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        local, remote = cluster.key_in("p0", "a"), cluster.key_in("p1", "b")  # n0 owns p0, n1 owns p1
        assert cluster.owner_of("p1") == "n1"
        outcome = await cluster.node("n0").execute([Op(OpKind.PUT, local, b"1"), Op(OpKind.PUT, remote, b"2")])
        assert outcome.status is OutcomeStatus.COMMITTED, outcome
        dropping = DroppingValues(cluster.network.handlers["n1"])
        cluster.network.handlers["n1"] = dropping
        coordination = cluster.node("n0").coordination
        fed: list[ExecuteFailed] = []
        real_feed = coordination.feed

        def feed(event: Any) -> None:
            if isinstance(event, ExecuteFailed):
                fed.append(event)
            real_feed(event)

        coordination.feed = feed
        outcome = await cluster.node("n0").execute(
            [Op(OpKind.GET, local), Op(OpKind.GET, remote), Op(OpKind.PUT, local, b"3")])
        assert dropping.dropped_count == 1
        # Heard as an answer lost, not a refusal: p1 ran the request and voted (found by review,
        # 2026-11-28: a refusal let a Cornus coordinator abort beside a yes vote in every log).
        assert [(event.partition, event.refused) for event in fed] == [("p1", False)], fed
        # An answer lost: the machine decides. ABORT if it heard of it before every vote was in;
        # else COMMIT, with what was read on p1 lost (UNKNOWN, sent to the status call). Which one
        # depends on whether p0's vote write or p1's answer comes first: either is an outcome the
        # data then agrees with, and neither an exception.
        cluster.network.handlers["n1"] = dropping.inner
        read = await cluster.node("n0").execute([Op(OpKind.GET, local)])
        assert read.status is OutcomeStatus.COMMITTED, read
        if outcome.status is OutcomeStatus.ABORTED:
            assert outcome.reason is AbortReason.PEER_UNAVAILABLE and "malformed answer" in outcome.detail, outcome
            assert dict(read.reads) == {local: b"1"}, read
        else:
            assert outcome.status is OutcomeStatus.UNKNOWN and "p1" in outcome.detail, outcome
            assert dict(read.reads) == {local: b"3"}, read


async def test_an_interactive_read_whose_owner_answers_too_few_values_aborts(tmp_path):
    async with local_cluster(tmp_path, node_count=2, partition_count=2) as cluster:
        remote = cluster.key_in("p1", "b")
        node = cluster.node("n0")
        cluster.network.handlers["n1"] = DroppingValues(cluster.network.handlers["n1"])
        txn = node.begin()
        with pytest.raises(TxnAborted) as aborted:
            await node.run_ops(txn, [Op(OpKind.GET, remote)])
        assert aborted.value.outcome.reason is AbortReason.PEER_UNAVAILABLE, aborted.value.outcome
