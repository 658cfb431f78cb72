"""A node stopped (SIGTERM) while a REST commit waits for its outcome still answers it with its
outcome, as the public gRPC API does: the REST server's graceful shutdown outlasts a commit's own
deadline (services.serve)."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from pathlib import Path

import httpx

from tests.cluster.conftest import storage_for
from tests.cluster.harness import keys_on, running_cluster
from tests.conftest import Services

# The coordinator waits this long for an answer and a vote that do not come (its participant is
# paused), then aborts: longer than the REST server's old 2 s of graceful shutdown, shorter than a commit's
# deadline (coordination.TIMEOUT_MS_COMMIT).
VOTE_WAIT_MS = 6_000
STOP_AFTER_S = 1.0


def test_a_commit_still_deciding_when_its_node_is_stopped_gets_its_outcome(services: Services, tmp_path: Path) -> None:
    """Found by review: uvicorn cancelled requests still running 2 s into its shutdown, and a
    commit waiting for its outcome then answered a bare "500 Internal Server Error", which says
    nothing of whether it committed."""
    storage = {**storage_for("emulator", services, tmp_path), "timeout_ms_call": "1000"}
    waits = {"timeout_ms_votes": VOTE_WAIT_MS, "timeout_ms_decision": VOTE_WAIT_MS,
             "timeout_ms_peer_request": VOTE_WAIT_MS}
    with running_cluster("2pc", storage, settings=waits) as cluster:
        cluster.start_all({"n1": "participant.before_log_vote:stop"})  # n1 pauses at its vote
        n1 = cluster.nodes["n1"].process
        assert n1 is not None
        keys = [keys_on("p1", cluster.partition_count, 1, "a")[0], keys_on("p2", cluster.partition_count, 1, "b")[0]]
        try:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                commit = pool.submit(cluster.execute, "n0", [{"op": "put", "key": k, "value": "v"} for k in keys])
                time.sleep(STOP_AFTER_S)
                n0 = cluster.nodes["n0"].process
                assert n0 is not None and not commit.done()
                n0.send_signal(signal.SIGTERM)
                response: httpx.Response = commit.result(timeout=VOTE_WAIT_MS / 1000 + 20)
        finally:
            os.kill(n1.pid, signal.SIGCONT)
        assert response.headers.get("content-type", "").startswith("application/json"), (response.status_code,
                                                                                         response.text)
        assert response.json()["outcome"] in ("aborted", "unknown"), response.text
