"""Transactions end to end on a real 3-node cluster, for every protocol and two backends."""

from __future__ import annotations

import pytest

from tests.cluster.harness import keys_on, running_cluster

PROTOCOLS = ["cornus", "2pc", "coordinator-log"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_multi_partition_commit_abort_and_conflict(protocol: str, storage: dict[str, str]) -> None:
    with running_cluster(protocol, storage) as cluster:
        cluster.start_all()
        # Keys on every partition, so every node is a participant.
        keys = [keys_on(f"p{i}", 6, 1, prefix="a")[0] for i in range(6)]
        response = cluster.execute("n0", [{"op": "put", "key": k, "value": f"v-{k}"} for k in keys])
        assert response.status_code == 200 and response.json()["outcome"] == "committed", response.text
        assert cluster.read("n1", keys) == {k: f"v-{k}" for k in keys}

        # Interactive: read, write, commit; then abort leaves nothing behind.
        txn = cluster.post("n2", "/v1/txn").json()["txn"]
        assert cluster.post("n2", f"/v1/txn/{txn}/read", {"keys": keys[:2]}).json()["values"] == {
            keys[0]: f"v-{keys[0]}", keys[1]: f"v-{keys[1]}"
        }
        assert cluster.post("n2", f"/v1/txn/{txn}/write", {"writes": {keys[0]: "x", keys[1]: None}}).status_code == 200
        committed = cluster.post("n2", f"/v1/txn/{txn}/commit")
        assert committed.status_code == 200 and committed.json()["outcome"] == "committed"
        assert cluster.read("n0", keys[:2]) == {keys[0]: "x", keys[1]: None}
        assert cluster.get("n1", f"/v1/txn/{txn}").json()["outcome"] == "committed"

        txn = cluster.post("n1", "/v1/txn").json()["txn"]
        cluster.post("n1", f"/v1/txn/{txn}/write", {"writes": {keys[2]: "never"}})
        aborted = cluster.post("n1", f"/v1/txn/{txn}/abort")
        assert aborted.status_code == 409 and aborted.json()["reason"] == "client"
        assert cluster.post("n1", f"/v1/txn/{txn}/commit").status_code == 409  # wrong state
        assert cluster.read("n2", [keys[2]]) == {keys[2]: f"v-{keys[2]}"}

        # Conflict: a second writer of a locked key aborts with a retryable reason (NO_WAIT).
        first = cluster.post("n0", "/v1/txn").json()["txn"]
        assert cluster.post("n0", f"/v1/txn/{first}/write", {"writes": {keys[3]: "first"}}).status_code == 200
        second = cluster.execute("n1", [{"op": "put", "key": keys[3], "value": "second"}])
        assert second.status_code == 409, second.text
        assert second.json()["reason"] == "conflict" and second.json()["retryable"] is True
        assert cluster.post("n0", f"/v1/txn/{first}/commit").json()["outcome"] == "committed"
        assert cluster.read("n2", [keys[3]]) == {keys[3]: "first"}

        # A failed check aborts the whole transaction and writes nothing.
        checked = cluster.execute("n2", [{"op": "put", "key": keys[4], "value": "no"},
                                         {"op": "check", "key": keys[5], "value": "wrong"}])
        assert checked.status_code == 409 and checked.json()["reason"] == "check_failed"
        assert checked.json()["retryable"] is False
        assert cluster.read("n0", [keys[4]]) == {keys[4]: f"v-{keys[4]}"}
