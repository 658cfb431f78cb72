"""The sync SDK end to end against a real 3-node cluster: commits, read-your-writes, abort on an
exception, conflicts retried, status, failover of new transactions, and bad input refused with a
typed error and nothing changed."""

from __future__ import annotations

import http.server
import threading

import pytest

from services.client import (
    ClientConfig,
    CornusClient,
    InvalidRequest,
    NotFound,
    Op,
    PartitionListing,
    ServerError,
    Status,
    Transaction,
    TransactionAborted,
    Unavailable,
    WrongState,
)
from tests.cluster.harness import Cluster, unknown_txn_id
from tests.worker import free_port

# Short backoff keeps retried tests fast; the bound on retries is what is under test.
FAST = ClientConfig(backoff_ms_min=5, backoff_ms_max=50, retry_count_max=3)


def test_commit_read_your_writes_and_status(urls: list[str], prefix: str) -> None:
    a, b = f"{prefix}a", f"{prefix}b"
    with CornusClient(urls, config=FAST) as client:
        put = client.put(a, "1")
        assert put.status is Status.COMMITTED and put.txn and put.attempt_count == 1

        # No get of these keys before the write: a read-only commit releases its read locks just
        # after it answers, so a write right behind it may meet them (NO_WAIT: a conflict).
        with client.transaction() as txn:
            assert txn.read([a, b]) == {a: "1", b: None}
            txn.write({a: "2", b: "x"})
            # The transaction sees its own writes before it commits.
            assert txn.read([a, b]) == {a: "2", b: "x"}
        assert txn.outcome is not None and txn.outcome.committed

        # Any node answers for the committed values and for the transaction's status.
        for url in urls:
            with CornusClient(url) as one:
                assert one.execute([Op.get(a), Op.get(b)]).reads == {a: "2", b: "x"}
                status = one.status(txn.txn)
                assert status.status is Status.COMMITTED, status
        assert client.get(a) == "2"
        assert client.get(f"{prefix}absent") is None
        with pytest.raises(NotFound):
            client.status(unknown_txn_id())


@pytest.mark.parametrize("protocol", ["cornus", "2pc", "coordinator-log"])
def test_protocol_per_transaction(urls: list[str], prefix: str, protocol: str) -> None:
    tag = {"cornus": "cornus", "2pc": "2pc", "coordinator-log": "clog"}[protocol]
    a, b = f"{prefix}{protocol}-a", f"{prefix}{protocol}-b"
    with CornusClient(urls, config=FAST) as client:
        outcome = client.execute([Op.put(a, "1"), Op.put(b, "1")], protocol=protocol)
        assert outcome.committed and outcome.txn.endswith("." + tag), outcome
        with client.transaction(protocol) as txn:
            txn.write({a: "2"})
        assert txn.outcome is not None and txn.outcome.committed and txn.txn.endswith("." + tag)
        assert client.execute([Op.get(a), Op.get(b)]).reads == {a: "2", b: "1"}
        with pytest.raises(InvalidRequest):
            client.execute([Op.put(a, "3")], protocol="3pc")
        assert client.get(a) == "2"


def test_new_transactions_rotate_over_the_nodes(urls: list[str], prefix: str) -> None:
    with CornusClient(urls) as client:
        begun = [client.begin() for _ in urls]
        assert sorted(txn.node_url for txn in begun) == sorted(urls)
        for index, txn in enumerate(begun):
            txn.write({f"{prefix}{index}": "v"})
            assert txn.commit().committed
        outcomes = [client.put(f"{prefix}x{index}", "v") for index in range(len(urls))]
        assert sorted(outcome.node_url for outcome in outcomes) == sorted(urls)


def test_exception_in_transaction_aborts_it(urls: list[str], prefix: str) -> None:
    key = f"{prefix}k"
    with CornusClient(urls, config=FAST) as client:
        client.put(key, "before")
        with pytest.raises(RuntimeError, match="boom"), client.transaction() as txn:
            txn.write({key: "never"})
            raise RuntimeError("boom")
        assert txn.outcome is not None and txn.outcome.status is Status.ABORTED
        assert txn.outcome.reason == "client"
        # Nothing was written, and the abort released the lock before it answered: a new writer
        # does not conflict. (Reading with a get first could: a read-only commit answers before
        # its read locks are released, so the write would race that release.)
        with client.transaction() as after:
            assert after.read([key]) == {key: "before"}
            after.write({key: "after"})
        assert client.get(key) == "after"
        # Aborting by hand inside the block is not an error.
        with client.transaction() as txn:
            txn.write({key: "never"})
            assert txn.abort().status is Status.ABORTED
        with pytest.raises(WrongState):
            txn.write({key: "late"})
        assert client.get(key) == "after"


def test_conflict_is_retried_by_run_transaction(urls: list[str], prefix: str) -> None:
    key = f"{prefix}counter"
    with CornusClient(urls, config=FAST) as client:
        client.put(key, "10")
        blocker = client.begin()
        blocker.write({key: "20"})  # holds the lock until it commits

        # A one-shot writer meets the lock: aborted, retryable, retried to the bound, no more.
        outcome = client.execute([Op.put(key, "nope")])
        assert outcome.status is Status.ABORTED and outcome.reason == "conflict" and outcome.retryable
        assert outcome.attempt_count == FAST.retry_count_max + 1

        calls: list[int] = []
        seen: list[str | None] = []

        def increment(txn: Transaction) -> int:
            calls.append(1)
            if len(calls) == 2:
                # Only now does the lock go away: the first run must have failed on it.
                assert blocker.commit().committed
            value = txn.read([key])[key]
            seen.append(value)
            txn.write({key: str(int(value or 0) + 1)})
            return int(value or 0) + 1

        assert client.run_transaction(increment) == 21
        assert len(calls) == 2 and seen == ["20"], "the first run aborted on the conflict before it read"
        assert client.get(key) == "21"

        # A conflict that outlasts every retry surfaces as a retryable TransactionAborted.
        blocker = client.begin()
        blocker.write({key: "30"})
        calls.clear()
        calls.extend([1, 1])  # past the run that would commit the blocker
        with pytest.raises(TransactionAborted) as aborted:
            client.run_transaction(increment)
        assert len(calls) == 2 + FAST.retry_count_max + 1
        assert aborted.value.retryable and aborted.value.outcome.reason == "conflict"
        assert blocker.commit().committed
        assert client.get(key) == "30"


def test_bad_input_raises_typed_errors_and_changes_nothing(urls: list[str], prefix: str) -> None:
    key = f"{prefix}k"
    with CornusClient(urls, config=FAST) as client:
        client.put(key, "v0")
        with pytest.raises(InvalidRequest):
            client.put("", "v")  # empty key: the server's 422
        with pytest.raises(InvalidRequest):
            client.put(key, "x" * (64 * 1024 + 1))  # over the value limit
        with pytest.raises(InvalidRequest):
            client.execute([])
        with pytest.raises(InvalidRequest):
            client.put(key, 5)  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest):
            client.status("no spaces allowed")
        assert client.get(key) == "v0"

        # A refused write leaves the interactive transaction running and unchanged.
        with client.transaction() as txn:
            with pytest.raises(InvalidRequest):
                txn.write({key: "y" * (64 * 1024 + 1)})
            assert txn.read([key]) == {key: "v0"}
            txn.write({f"{prefix}other": "ok"})
        assert txn.outcome is not None and txn.outcome.committed
        assert client.get(key) == "v0"

        # The server, not only the client, refuses calls on an ended transaction.
        stale = Transaction(client, txn.txn, txn.node_url)
        with pytest.raises(WrongState) as wrong:
            stale.write({key: "late"})
        assert wrong.value.status_code == 409
        assert client.get(key) == "v0"

    with pytest.raises(InvalidRequest):
        CornusClient(["ftp://127.0.0.1:1"])
    with pytest.raises(InvalidRequest):
        CornusClient([])


def test_new_transactions_fail_over_from_a_dead_node(urls: list[str], prefix: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with CornusClient([dead, urls[0]], config=FAST) as client:
        for index in range(4):  # both rotation starts: dead first and live first
            outcome = client.put(f"{prefix}{index}", "v")
            assert outcome.committed and outcome.node_url == urls[0] and outcome.attempt_count == 1
            txn = client.begin()
            assert txn.node_url == urls[0]
            assert txn.abort().status is Status.ABORTED


def test_no_reachable_node_is_unavailable_after_bounded_retries() -> None:
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    with CornusClient(dead, config=FAST) as client:
        outcome = client.execute([Op.put("k", "v")])
        assert outcome.status is Status.UNAVAILABLE and outcome.retryable
        assert outcome.attempt_count == FAST.retry_count_max + 1
        with pytest.raises(Unavailable):
            client.begin()
        calls: list[int] = []
        with pytest.raises(Unavailable):
            client.run_transaction(lambda txn: calls.append(1))
        assert calls == [], "the function never runs without a transaction"


def test_partition_listing_says_which_node_answered_its_peers_and_every_owner(cluster: Cluster) -> None:
    """What `cornus rebalance` judges placement by, read through the sync client as well."""
    node_ids = list(cluster.nodes)
    with CornusClient([node.url for node in cluster.nodes.values()], config=FAST) as client:
        for node_id, node in cluster.nodes.items():
            listing = client.partition_listing(node.url)
            assert listing.node == node_id
            assert sorted(listing.peers) == sorted(node_ids)
            assert listing.partition_owners == {}
            assert listing.partitions and all(row.owner in node_ids for row in listing.partitions)


def test_a_partition_listing_from_an_older_node_is_a_clear_error() -> None:
    """A node from before the listing named itself, its peers and its owners answers only rows."""
    with pytest.raises(ServerError, match="older than this client"):
        PartitionListing.from_json("http://127.0.0.1:1", {"partitions": []})
    with pytest.raises(ServerError, match="not a partition listing"):
        PartitionListing.from_json("http://127.0.0.1:1", ["p0"])


class _ProxyAnswering503(http.server.BaseHTTPRequestHandler):
    """What a proxy in front of the nodes answers when its upstream connection broke after it
    forwarded the request: 503, and no body of a Cornus node's."""

    posts: list[str] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).posts.append(self.path)
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        return None


def test_a_503_no_node_wrote_is_unknown_where_the_call_may_have_committed() -> None:
    """A node answers 503 only before it did any work, with its error code; a bodyless 503 is a
    proxy's, whose request may have reached a node that committed: retrying it as 'nothing
    committed' could apply the transaction twice."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ProxyAnswering503)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with CornusClient([f"http://127.0.0.1:{server.server_address[1]}"], config=FAST) as client:
            outcome = client.execute([Op.put("k", "v")])
        assert outcome.status is Status.UNKNOWN and not outcome.retryable, outcome
        assert _ProxyAnswering503.posts == ["/v1/execute"], "the SDK sent it again"
    finally:
        server.shutdown()
        server.server_close()


class _ProxyBeforeANode(http.server.BaseHTTPRequestHandler):
    """A proxy in front of a node that begins a transaction, then answers the transaction's write
    and every status question with a bodyless 503 of its own (its upstream connection broke)."""

    seen: list[str] = []

    def _answer(self, code: int, body: bytes = b"") -> None:
        type(self).seen.append(f"{self.command} {self.path}")
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path == "/v1/txn":
            self._answer(201, b'{"txn": "1.n0.abcdef.1.cornus", "protocol": "cornus"}')
        else:
            self._answer(503)

    def do_GET(self) -> None:
        self._answer(503)

    def log_message(self, *_: object) -> None:
        return None


def test_a_write_a_proxy_answered_503_leaves_the_transaction_only_to_abort() -> None:
    """Found by review: a proxy's 503 to a write was "unavailable" (nothing happened), and the
    caller's commit then committed the write the node had buffered. It is ambiguous, as a 502 page
    is: the transaction may only be aborted. And the status call never reports a 503 as the
    transaction's outcome ("unavailable, retry" reads as nothing committed): it asks the next
    node, and raises when none answers."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ProxyBeforeANode)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with CornusClient([f"http://127.0.0.1:{server.server_address[1]}"], config=FAST) as client:
            txn = client.begin()
            with pytest.raises(ServerError):
                txn.write({"k": "v"})
            with pytest.raises(WrongState, match="abort it"):
                txn.commit()
            with pytest.raises(Unavailable):
                client.status(txn.txn)
        assert not any(line.endswith("/commit") for line in _ProxyBeforeANode.seen), _ProxyBeforeANode.seen
    finally:
        server.shutdown()
        server.server_close()
