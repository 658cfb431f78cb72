"""`cornus rebalance --expect-peers ... --member-urls ...`, the check the Helm chart's post-upgrade
hook runs: placement is judged from every expected node's own answer and computed from the
expected node set, never taken from whichever node answers; bad input is refused before any wait;
a wait that runs out names every node and partition that is not there yet.

The end-to-end case (the 5-replica hook against the pods of a 3-replica install) is in
tests/deploy/test_chart_cluster.py."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from cornus.runtime.config import load_node_config
from services.cli import _peer_text, _placement
from services.client import PartitionInfo, PartitionListing
from tests.worker import free_port

# A rebalance that is refused must say so at once: nothing is waited for.
REFUSAL_TIMEOUT_S = 20.0
# The wait the timeout test gives the command, and the most its run may take beyond it: the
# interpreter's start, and one round of requests to ports where nothing listens (refused at once).
WAIT_S = 1.0
OVERRUN_S_MAX = 20.0
PARTITION_COUNT = 6
THREE = {f"n{i}": f"127.0.0.1:{7100 + i}" for i in range(3)}
FIVE = {f"n{i}": f"127.0.0.1:{7100 + i}" for i in range(5)}


def _peers(nodes: dict[str, str]) -> str:
    return ",".join(f"{node}={address}" for node, address in nodes.items())


def _rebalance(*args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", "rebalance", *args], capture_output=True,
                          text=True, timeout=timeout_s, check=False)


def _preferred_by(peers: dict[str, str], partition: str) -> str:
    """What a node running with `peers` prefers for `partition`: the node's own config decides."""
    config = load_node_config(environ={}, overrides={"node_id": next(iter(peers)), "peers": _peers(peers),
                                                     "partition_count": PARTITION_COUNT})
    return config.preferred_owner(partition)


def _listing(node: str, peers: dict[str, str], owners: dict[str, str], serves: set[str]) -> PartitionListing:
    """`node`'s answer: it runs with `peers`; storage names `owners`; it serves `serves`."""
    rows = tuple(
        PartitionInfo(f"http://{node}", f"p{i}", owners[f"p{i}"], 1, 1, 4000, "", _preferred_by(peers, f"p{i}"),
                      f"p{i}" in serves)
        for i in range(PARTITION_COUNT)
    )
    return PartitionListing(f"http://{node}", node, dict(peers), {}, rows)


def _settled(peers: dict[str, str]) -> dict[str, PartitionListing]:
    """Every node of `peers` running with them, each partition held and served by its preferred node."""
    owners = {f"p{i}": _preferred_by(peers, f"p{i}") for i in range(PARTITION_COUNT)}
    return {node: _listing(node, peers, owners, {p for p, o in owners.items() if o == node}) for node in peers}


def test_placement_of_a_settled_node_set_is_done() -> None:
    state = _placement(FIVE, dict(_settled(FIVE)))
    assert state.done and not state.waiting and not state.unplaced


def test_three_nodes_settled_among_themselves_are_not_the_placement_of_five() -> None:
    """The reproduced bug: three nodes, each satisfied with its own 3-node peer list, while the
    upgrade asked for five. Every node's rows say "placed"; the check must not believe them."""
    answers: dict[str, PartitionListing | str] = {**_settled(THREE), "n3": "connection refused",
                                                  "n4": "connection refused"}
    assert all(row.placed for listing in _settled(THREE).values() for row in listing.partitions)
    state = _placement(FIVE, answers)
    assert not state.done
    assert [line.split(":")[0] for line in state.waiting] == ["n0", "n1", "n2", "n3", "n4"], state.waiting
    assert "runs with the node set n0,n1,n2, not n0,n1,n2,n3,n4" in state.waiting[0]
    # No node runs the expected set yet, so no partition can count as placed.
    assert state.partition_count == 0


def test_partitions_not_yet_on_their_preferred_node_among_the_expected_set_are_listed() -> None:
    """All five nodes run the new set, but the partitions are still where three nodes put them:
    each partition whose preferred node among five differs is listed, with its holder."""
    stale_owners = {f"p{i}": _preferred_by(THREE, f"p{i}") for i in range(PARTITION_COUNT)}
    answers: dict[str, PartitionListing | str] = {
        node: _listing(node, FIVE, stale_owners, {p for p, o in stale_owners.items() if o == node}) for node in FIVE
    }
    state = _placement(FIVE, answers)
    partitions = [f"p{i}" for i in range(PARTITION_COUNT)]
    expected_moves = [(p, stale_owners[p], _preferred_by(FIVE, p)) for p in partitions
                      if stale_owners[p] != _preferred_by(FIVE, p)]
    assert expected_moves, "the example must move something"
    assert not state.waiting and state.unplaced == expected_moves


def test_a_partition_held_but_not_yet_served_by_its_preferred_node_is_not_placed() -> None:
    """The record names the preferred node, but it has not recovered the partition yet (its own
    answer says it does not serve it): still moving."""
    answers: dict[str, PartitionListing | str] = dict(_settled(FIVE))
    holder = _preferred_by(FIVE, "p0")
    settled = answers[holder]
    assert isinstance(settled, PartitionListing)
    owners = {row.partition: row.owner for row in settled.partitions}
    serves = {row.partition for row in settled.partitions if row.served_here} - {"p0"}
    answers[holder] = _listing(holder, FIVE, owners, serves)
    state = _placement(FIVE, answers)
    assert state.unplaced == [("p0", holder, holder)] and not state.done


def test_a_node_with_another_partition_count_is_waited_for_and_its_partitions_not_counted() -> None:
    answers: dict[str, PartitionListing | str] = dict(_settled(FIVE))
    odd = answers["n4"]
    assert isinstance(odd, PartitionListing)
    answers["n4"] = PartitionListing(odd.node_url, "n4", dict(FIVE), {}, odd.partitions[:-1])
    state = _placement(FIVE, answers)
    assert state.waiting == [f"n4: has {PARTITION_COUNT - 1} partitions, n0 has {PARTITION_COUNT}"]
    # What n4 prefers is not served by a node that agrees on the partitions.
    assert state.unplaced == [(p, "n4", "n4") for p in (f"p{i}" for i in range(PARTITION_COUNT))
                              if _preferred_by(FIVE, p) == "n4"]
    assert not state.done


def test_an_answer_from_another_node_than_its_url_names_is_waited_for() -> None:
    """A --member-urls entry that points at the wrong pod: its answer must not stand for n1."""
    answers: dict[str, PartitionListing | str] = dict(_settled(FIVE))
    answers["n1"] = answers["n2"]
    state = _placement(FIVE, answers)
    assert state.waiting == ["n1: http://n2 answers as node 'n2'"] and not state.done


def test_a_node_with_the_node_set_at_other_addresses_is_waited_for() -> None:
    moved = {**FIVE, "n3": "127.0.0.1:9999"}
    answers: dict[str, PartitionListing | str] = dict(_settled(FIVE))
    settled = answers["n3"]
    assert isinstance(settled, PartitionListing)
    answers["n3"] = PartitionListing(settled.node_url, "n3", moved, {}, settled.partitions)
    state = _placement(FIVE, answers)
    assert state.waiting == [f"n3: runs with other peer addresses ({_peer_text(moved)})"] and not state.done


def test_nodes_that_disagree_on_partition_owners_are_waited_for() -> None:
    answers: dict[str, PartitionListing | str] = dict(_settled(FIVE))
    settled = answers["n2"]
    assert isinstance(settled, PartitionListing)
    answers["n2"] = PartitionListing(settled.node_url, "n2", dict(FIVE), {"p0": "n4"}, settled.partitions)
    state = _placement(FIVE, answers)
    assert state.waiting == ["n2: prefers other owners (partition_owners) than n0"] and not state.done


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--expect-peers", _peers(THREE)], "--expect-peers and --member-urls go together"),
        (["--member-urls", "n0=http://127.0.0.1:8100"], "--expect-peers and --member-urls go together"),
        ([], "give --url, or --expect-peers with --member-urls"),
        (["--url", "http://127.0.0.1:8100", "--expect-peers", _peers(THREE), "--member-urls",
          "n0=http://127.0.0.1:8100,n1=http://127.0.0.1:8101,n2=http://127.0.0.1:8102"], "not both"),
        (["--expect-peers", _peers(THREE), "--member-urls", "n0=http://127.0.0.1:8100,n1=http://127.0.0.1:8101"],
         "missing: n2"),
        (["--expect-peers", _peers(THREE), "--member-urls",
          "n0=http://127.0.0.1:8100,n1=http://127.0.0.1:8101,n2=http://127.0.0.1:8102,n9=http://127.0.0.1:8109"],
         "unknown: n9"),
        (["--expect-peers", "n0=127.0.0.1:7100,n0=127.0.0.1:7101", "--member-urls", "n0=http://127.0.0.1:8100"],
         "peers name n0 more than once"),
        (["--expect-peers", "n0=nowhere", "--member-urls", "n0=http://127.0.0.1:8100"], "must look like host:port"),
        (["--expect-peers", "n0=127.0.0.1:7100", "--member-urls", "n0=ftp://127.0.0.1:8100"], "http://HOST:PORT"),
        (["--expect-peers", "n0=127.0.0.1:7100", "--member-urls", "n0"], "must be NODE=URL"),
        (["--expect-peers", "n0=127.0.0.1:7100", "--member-urls", "n0=http://127.0.0.1:8100", "--timeout-s", "0"],
         "--timeout-s must be in"),
    ],
)
def test_rebalance_refuses_bad_input_before_waiting(args: list[str], message: str) -> None:
    # A long wait: a command that accepted the input would outlive the subprocess timeout.
    wait = [] if "--timeout-s" in args else ["--timeout-s", "600"]
    done = _rebalance(*args, *wait, timeout_s=REFUSAL_TIMEOUT_S)
    assert done.returncode == 2, f"exit {done.returncode}:\n{done.stdout}{done.stderr}"
    assert message in done.stderr, done.stderr


def test_rebalance_times_out_naming_every_node_that_does_not_answer() -> None:
    """Nothing listens where the expected nodes should answer: exit 1 once the wait is over, with
    each node and why it counts as missing."""
    urls = {node: f"http://127.0.0.1:{free_port()}" for node in THREE}
    started = time.monotonic()
    done = _rebalance("--expect-peers", _peers(THREE), "--member-urls", ",".join(f"{n}={u}" for n, u in urls.items()),
                      "--timeout-s", str(WAIT_S), "--timeout-ms-request", "2000", timeout_s=WAIT_S + OVERRUN_S_MAX)
    took_s = time.monotonic() - started
    assert done.returncode == 1, f"exit {done.returncode}:\n{done.stdout}{done.stderr}"
    assert took_s >= WAIT_S, f"gave up after {took_s:.1f} s, before its {WAIT_S} s wait"
    assert f"not placed within {WAIT_S:g} s among n0,n1,n2" in done.stderr, done.stderr
    for node, url in urls.items():
        assert f"node {node}: no answer" in done.stderr and url in done.stderr, done.stderr
    assert "no node answered with the expected node set" in done.stderr, done.stderr
