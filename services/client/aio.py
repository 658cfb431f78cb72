"""The asynchronous client SDK (httpx.AsyncClient), call for call the same as the sync one
(services/client/sync.py), awaited:

    async with AsyncCornusClient(["http://127.0.0.1:8100", "http://127.0.0.1:8101"]) as client:
        await client.put("alice", "100")
        async with client.transaction() as txn:    # commits on exit, aborts on an exception
            balance = int((await txn.read(["alice"]))["alice"] or 0)
            await txn.write({"alice": str(balance - 10)})
        await client.run_transaction(transfer)     # reruns `await transfer(txn)` on retryable aborts
        await client.get_bytes("blob")             # any value's exact bytes (get: text only)

Interactive transactions stay on the node that began them; new ones rotate over the nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import httpx

from services.client._core import (
    BUSY_RESEND_COUNT_MAX,
    IN_DOUBT,
    ClientConfig,
    NodeIdentity,
    NodeRotation,
    backoff_s,
    call_deadline_passed,
    check_keys,
    check_ops,
    check_writes,
    client_txn,
    describe,
    execute_body,
    got_text,
    identity_from,
    is_busy,
    is_read_only,
    is_unsent,
    normalize_url,
    normalize_urls,
    note_id_in_doubt,
    note_refusal,
    parse_ok,
    parse_outcome,
    read_bytes,
    read_text,
    refused_in_doubt,
    status_answered,
    txn_path,
    unknown,
    unreachable,
    with_attempts,
)
from services.client.types import (
    CornusError,
    Op,
    Outcome,
    PartitionInfo,
    PartitionListing,
    ServerError,
    TransactionAborted,
    TransactionFailed,
    TxnInfo,
    Unavailable,
    WrongState,
)

T = TypeVar("T")


class AsyncTransaction:
    """An interactive transaction. Every call goes to `node_url`, the node that began it."""

    def __init__(self, client: AsyncCornusClient, txn: str, node_url: str) -> None:
        assert txn and node_url
        self.txn = txn
        self.node_url = node_url
        # Set once the transaction is known to have ended (committed, aborted, or given up on).
        self.outcome: Outcome | None = None
        self._client = client
        self._aborted_by_caller = False
        # Set when a read or write failed after it may have reached the node: what the
        # transaction holds is unknown, so it may only be aborted.
        self._ambiguous = ""

    @property
    def ended(self) -> bool:
        return self.outcome is not None

    async def read(self, keys: str | Sequence[str]) -> dict[str, str | None]:
        """The values of `keys` as text (None: absent), locked until the transaction ends.
        ValueNotText, holding its bytes, for a value that is not UTF-8 (stored through gRPC):
        read_bytes reads any value."""
        names = check_keys(keys)
        return read_text(self.node_url, await self._call("/read", {"keys": names}), names)

    async def read_bytes(self, keys: str | Sequence[str]) -> dict[str, bytes | None]:
        """The exact bytes of the values of `keys`, text or not (None: absent), locked until the
        transaction ends."""
        names = check_keys(keys)
        return read_bytes(self.node_url, await self._call("/read", {"keys": names}), names)

    async def write(self, writes: Mapping[str, str | None]) -> None:
        """Buffer writes (None deletes the key); they apply only if the transaction commits."""
        await self._call("/write", {"writes": check_writes(writes)})

    async def delete(self, *keys: str) -> None:
        await self.write(dict.fromkeys(keys))

    async def commit(self) -> Outcome:
        """The outcome; it never raises for an abort (see Outcome.raise_for_outcome)."""
        self._check_active()
        if self._ambiguous:
            raise WrongState(0, "wrong_state", f"transaction {self.txn}: an earlier call failed after it may "
                             f"have reached the node ({self._ambiguous}), so its writes may or may not be "
                             "buffered: abort it and run a new one")
        try:
            response = await self._client._post(self.node_url + txn_path(self.txn, "/commit"))
        except httpx.TransportError as error:
            if is_unsent(error):
                # The node never saw the commit, so it cannot have committed.
                outcome = unreachable(self.node_url, self.txn, describe(error))
            else:
                outcome = unknown(self.node_url, self.txn, error)
        else:
            outcome = parse_outcome(self.node_url, response, self.txn, may_have_committed=True, commit=True)
        self.outcome = outcome
        return outcome

    async def abort(self) -> Outcome:
        self._check_active()
        try:
            response = await self._client._post(self.node_url + txn_path(self.txn, "/abort"))
        except httpx.TransportError as error:
            raise Unavailable(unreachable(self.node_url, self.txn, describe(error))) from error
        self.outcome = parse_outcome(self.node_url, response, self.txn, may_have_committed=False)
        self._aborted_by_caller = True
        return self.outcome

    def _check_active(self) -> None:
        if self.outcome is not None:
            raise WrongState(0, "wrong_state", f"transaction {self.txn} already ended: {self.outcome.status}")

    async def _call(self, suffix: str, body: dict[str, Any]) -> Any:
        self._check_active()
        try:
            response = await self._client._post(self.node_url + txn_path(self.txn, suffix), body)
        except httpx.TransportError as error:
            # The transaction cannot move to another node, but nothing commits before commit, so
            # the caller (or run_transaction) may rerun it from the start as a new one; this one
            # may no longer commit when the call may have reached the node.
            if not is_unsent(error):
                self._ambiguous = describe(error)
            raise Unavailable(unreachable(self.node_url, self.txn, describe(error))) from error
        try:
            return parse_ok(self.node_url, response, 200, self.txn)
        except TransactionAborted as aborted:
            self.outcome = aborted.outcome  # the node ended it: exiting must not abort it again
            raise
        except ServerError as error:
            # Not the API's answer (a proxy's page): the call may have reached the node.
            self._ambiguous = str(error)
            raise


class AsyncTransactionScope:
    """`async with client.transaction() as txn:` begins on entry; on a normal exit it commits and raises
    TransactionFailed unless the commit happened; on an exception it aborts and lets it through."""

    def __init__(self, client: AsyncCornusClient, protocol: str | None) -> None:
        self._client = client
        self._protocol = protocol
        self._txn: AsyncTransaction | None = None

    async def __aenter__(self) -> AsyncTransaction:
        assert self._txn is None, "a TransactionScope is entered once"
        self._txn = await self._client.begin(self._protocol)
        return self._txn

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        txn = self._txn
        assert txn is not None
        if exc_type is not None:
            if not txn.ended:
                # Best effort: the caller's exception matters more, and a transaction whose abort
                # is lost still ends at the node's idle timeout without committing.
                with contextlib.suppress(CornusError):
                    await txn.abort()
            return
        if not txn.ended:
            try:
                await txn.commit()
            except WrongState:
                # Refused before it left (an earlier call's answer was lost): ended here rather
                # than holding its locks until the node's idle timeout (found by audit).
                with contextlib.suppress(CornusError):
                    await txn.abort()
                raise
        assert txn.outcome is not None
        if not txn._aborted_by_caller:
            txn.outcome.raise_for_outcome()


class AsyncCornusClient:
    """A client of a Cornus cluster. One event loop at a time, as httpx.AsyncClient; aclose() when done."""

    def __init__(
        self,
        urls: str | Iterable[str],
        *,
        config: ClientConfig | None = None,
        http: httpx.AsyncClient | None = None,
        rng: random.Random | None = None,
        admin_token: str | None = None,
    ) -> None:
        self.urls = normalize_urls(urls)
        # Sent with the admin calls only (transactions, resolve, the partition listing), to nodes
        # that have an admin_token.
        self._admin_headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else None
        self.config = config or ClientConfig()
        self._rotation = NodeRotation(self.urls)
        self._owns_http = http is None
        self._http = http or httpx.AsyncClient(timeout=self.config.timeout)
        self._rng = rng or random.Random()
        # url -> what its /healthz said (None: a node that takes no client-chosen ids).
        self._identities: dict[str, NodeIdentity | None] = {}
        self._refusals_logged: set[tuple[str, str]] = set()

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncCornusClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # --- one-shot transactions ---

    async def execute(self, ops: Iterable[Op], protocol: str | None = None) -> Outcome:
        """Run `ops` as one transaction, retrying retryable outcomes (bounded). Returns every
        outcome, committed or not; raises only for a request the server refuses (4xx)."""
        checked = check_ops(ops)
        body = execute_body(checked, protocol)
        read_only = is_read_only(checked)
        retry_index = 0
        while True:
            outcome = await self._execute_once(body, read_only)
            if not outcome.retryable or retry_index >= self.config.retry_count_max:
                return with_attempts(outcome, retry_index + 1)
            await asyncio.sleep(backoff_s(self.config, retry_index, self._rng))
            retry_index += 1

    async def _execute_once(self, body: dict[str, Any], read_only: bool) -> Outcome:
        """One attempt: on a node that can be reached, under a new id of this client's when it
        writes (so that an answer lost after the request left is UNKNOWN with an id the status call
        can be asked about), under a server-chosen one when it reads only (a lost answer is then
        safe to rerun) or when the node refuses the client's id (nothing ran)."""
        tried: list[str] = []
        for url in self._rotation.order():
            txn = "" if read_only else await self._client_txn(url, body, tried)
            if txn is None:
                continue  # unreachable: `tried` says why
            busy_count = 0
            # A refused client id is dropped, and the next try goes without; a node too busy to
            # read it is sent it again as it was, at most BUSY_RESEND_COUNT_MAX times.
            while True:
                try:
                    response = await self._post(url + "/v1/execute", {**body, "txn": txn} if txn else body)
                except httpx.TransportError as error:
                    if is_unsent(error):
                        tried.append(f"{url} ({describe(error)})")
                        break
                    if read_only:
                        return unreachable(url, "", describe(error))  # nothing written: safe to rerun
                    return unknown(url, txn, error)
                refused = self._refused(url, response) if txn else ""
                if refused == IN_DOUBT:
                    return refused_in_doubt(url, txn, response)
                if refused:
                    txn = ""
                    continue
                if txn and is_busy(response) and busy_count < BUSY_RESEND_COUNT_MAX:
                    await asyncio.sleep(backoff_s(self.config, busy_count, self._rng))
                    busy_count += 1
                    continue
                outcome = parse_outcome(url, response, txn, may_have_committed=True, own_id=bool(txn))
                if txn:
                    note_id_in_doubt(self._identities, url, outcome)
                return outcome
        return unreachable("", "", f"no node reachable: {', '.join(tried)}")

    async def _client_txn(self, url: str, body: dict[str, Any], tried: list[str]) -> str | None:
        """A new client-chosen id for a one-shot sent to `url` ("": none, go without; None: the
        node cannot be reached, as `tried` now says). The node's id comes from its /healthz, once
        per URL."""
        if url not in self._identities:
            asked_s = time.time()
            try:
                response = await self._get(url + "/healthz")
            except httpx.TransportError as error:
                # Sent or not, the node did not answer (found by audit: the one-shot then went to
                # it without an id, and a lost answer left it UNKNOWN with none to ask about).
                tried.append(f"{url} ({describe(error)})")
                return None
            keep, identity = identity_from(response, asked_s, time.time())
            if not keep:
                return ""
            self._identities[url] = identity
        identity = self._identities[url]
        return "" if identity is None else client_txn(identity, body.get("protocol"))

    def _refused(self, url: str, response: httpx.Response) -> str:
        return note_refusal(self._identities, self._refusals_logged, url, response)

    async def get(self, key: str) -> str | None:
        """The value of `key` as text (None: absent). Raises TransactionFailed if the read did not
        commit, ValueNotText (holding its bytes) if the value is not UTF-8: get_bytes reads any."""
        return got_text((await self.execute([Op.get(key)])).raise_for_outcome(), key)

    async def get_bytes(self, key: str) -> bytes | None:
        """The exact bytes of the value of `key`, text or not (None: absent). Raises
        TransactionFailed if the read did not commit."""
        return (await self.execute([Op.get(key)])).raise_for_outcome().read_bytes(key)

    async def put(self, key: str, value: str) -> Outcome:
        """Write one key; the committed outcome, else TransactionFailed."""
        return (await self.execute([Op.put(key, value)])).raise_for_outcome()

    async def delete(self, key: str) -> Outcome:
        return (await self.execute([Op.delete(key)])).raise_for_outcome()

    # --- interactive transactions ---

    async def begin(self, protocol: str | None = None) -> AsyncTransaction:
        """Begin on the next node; any node that cannot take it (unreachable, recovering,
        overloaded) passes it to the next, which is safe because a new transaction holds nothing."""
        body = None if protocol is None else {"protocol": protocol}
        failures: list[str] = []
        last: Unavailable | None = None
        for url in self._rotation.order():
            try:
                response = await self._post(url + "/v1/txn", body)
            except httpx.TransportError as error:
                failures.append(f"{url} ({describe(error)})")
                continue
            try:
                data = parse_ok(url, response, 201)
            except Unavailable as unavailable:
                last = unavailable
                failures.append(unavailable.outcome.detail)
                continue
            txn = data.get("txn") if isinstance(data, dict) else None
            if not isinstance(txn, str) or not txn:
                raise ServerError(201, "bad_response", f"{url}: begin returned {data!r}"[:400])
            return AsyncTransaction(self, txn, url)
        outcome = unreachable("", "", f"no node could begin a transaction: {'; '.join(failures)}")
        raise Unavailable(outcome) from last

    def transaction(self, protocol: str | None = None) -> AsyncTransactionScope:
        return AsyncTransactionScope(self, protocol)

    async def run_transaction(
        self, fn: Callable[[AsyncTransaction], Awaitable[T]], protocol: str | None = None
    ) -> T:
        """Run fn(txn) in a transaction and commit; on a retryable failure rerun the WHOLE coroutine function
        in a new transaction (its reads may have changed), at most retry_count_max more times.
        fn must have no side effects outside the transaction, as it may run more than once."""
        retry_index = 0
        while True:
            try:
                async with self.transaction(protocol) as txn:
                    result = await fn(txn)
                return result
            except TransactionFailed as failed:
                if not failed.retryable or retry_index >= self.config.retry_count_max:
                    raise
            await asyncio.sleep(backoff_s(self.config, retry_index, self._rng))
            retry_index += 1

    # --- status and admin ---

    async def status(self, txn: str, url: str | None = None) -> Outcome:
        """What the cluster knows of `txn` (status ACTIVE while it runs), for outcome_keep_ms (10
        minutes by default) after its records are collected. NotFound if no node knows it, no
        request of it can still be on its way (a peer request's deadline after its begin) and it
        is younger than that window: it never committed. UNKNOWN if nobody knows it otherwise
        (never take that for "never happened"; ask again). Any node can answer, so an
        unreachable node, one still recovering (503), or a 404 not worded as a node
        words it (a gateway's) passes the question on; Unavailable if none answered."""
        path = txn_path(txn)
        failures: list[str] = []
        for node_url in [normalize_url(url)] if url else self._rotation.order():
            try:
                response = await self._get(node_url + path)
            except httpx.TransportError as error:
                failures.append(f"{node_url} ({describe(error)})")
                continue
            if not status_answered(response):
                # No answer about the transaction (a node that cannot answer now, a proxy's
                # page, a gateway's 404): never an outcome of it, which would read "nothing
                # committed, retry" (found by review, and by audit for the 404). The next node
                # may answer.
                failures.append(f"{node_url} ({response.status_code} {response.text[:100]!r})")
                continue
            return parse_outcome(node_url, response, txn, may_have_committed=False)
        raise Unavailable(unreachable("", txn, f"no node answered: {', '.join(failures)}"))

    async def transactions(self, url: str | None = None) -> list[TxnInfo]:
        """In-flight and in-doubt transactions of one node (`url`), or of every node of this client."""
        rows: list[TxnInfo] = []
        for node_url in [normalize_url(url)] if url else self.urls:
            try:
                response = await self._get(node_url + "/v1/admin/transactions", self._admin_headers)
            except httpx.TransportError as error:
                raise Unavailable(unreachable(node_url, "", describe(error))) from error
            body = parse_ok(node_url, response, 200)
            if not isinstance(body, list):
                raise ServerError(200, "bad_response", f"{node_url}: listing is not a list: {body!r}"[:400])
            rows.extend(TxnInfo.from_json(node_url, item) for item in body)
        return rows

    async def partition_listing(self, url: str) -> PartitionListing:
        """One node's (`url`'s) whole partition listing: which node answered, the node set and the
        explicit preferred owners it runs with, and who owns each partition as storage says now."""
        node_url = normalize_url(url)
        try:
            response = await self._get(node_url + "/v1/partitions", self._admin_headers)
        except httpx.TransportError as error:
            raise Unavailable(unreachable(node_url, "", describe(error))) from error
        return PartitionListing.from_json(node_url, parse_ok(node_url, response, 200))

    async def partitions(self, url: str | None = None) -> list[PartitionInfo]:
        """Who owns each partition, as storage says now (asked of `url`, else of the first node
        that answers)."""
        failures: list[str] = []
        for node_url in [normalize_url(url)] if url else self.urls:
            try:
                response = await self._get(node_url + "/v1/partitions", self._admin_headers)
            except httpx.TransportError as error:
                failures.append(f"{node_url} ({describe(error)})")
                continue
            body = parse_ok(node_url, response, 200)
            if not isinstance(body, dict) or not isinstance(body.get("partitions"), list):
                raise ServerError(200, "bad_response", f"{node_url}: not a partition listing: {body!r}"[:400])
            return [PartitionInfo.from_json(node_url, row) for row in body["partitions"]]
        raise Unavailable(unreachable("", "", f"no node reachable: {', '.join(failures)}"))

    async def resolve(self, txn: str, url: str | None = None, *, force: bool = False) -> Outcome:
        """Run termination for `txn` by hand (any node can: it reads storage directly). WrongState
        for a transaction its coordinator's node still runs, unless `force` (which aborts it where
        nothing voted yet)."""
        path = f"/v1/admin/resolve/{txn_path(txn).removeprefix('/v1/txn/')}" + ("?force=true" if force else "")
        failures: list[str] = []
        for node_url in [normalize_url(url)] if url else self._rotation.order():
            try:
                response = await self._post(node_url + path, headers=self._admin_headers)
            except httpx.TransportError as error:
                if is_unsent(error):
                    failures.append(f"{node_url} ({describe(error)})")
                    continue
                return unknown(node_url, txn, error)
            if response.status_code == 503:
                # Refused, or a proxy's page: no outcome of the transaction, which UNAVAILABLE would
                # say ("nothing committed") of one that may be in doubt or committed (found by
                # audit). The next node may run it.
                failures.append(f"{node_url} (503 {response.text[:100]!r})")
                continue
            return parse_outcome(node_url, response, txn, may_have_committed=True)
        raise Unavailable(unreachable("", txn, f"no node ran it: {', '.join(failures)}"))

    # --- HTTP: every call carries the configured deadline, also on a caller-supplied httpx.AsyncClient ---

    async def _post(self, url: str, body: Any = None, headers: dict[str, str] | None = None) -> httpx.Response:
        return await self._call(self._http.build_request("POST", url, json=body, headers=headers,
                                                         timeout=self.config.timeout))

    async def _get(self, url: str, headers: dict[str, str] | None = None) -> httpx.Response:
        return await self._call(self._http.build_request("GET", url, headers=headers, timeout=self.config.timeout))

    async def _call(self, request: httpx.Request) -> httpx.Response:
        """Send `request` and read its whole answer by the call's deadline (httpx's timeout
        bounds each read, not the call). Past it: ReadTimeout, as a lost answer, once the request
        started to leave; before (it waited for a pooled connection all along), PoolTimeout, as a
        request never sent, which may go to another node (found by review: it was UNKNOWN)."""
        sent = False
        traced = request.extensions.get("trace")

        async def trace(event: str, info: dict[str, Any]) -> None:
            nonlocal sent
            if event.endswith("send_request_headers.started"):
                sent = True
            if traced is not None:
                result = traced(event, info)
                if inspect.isawaitable(result):
                    await result

        request.extensions["trace"] = trace
        try:
            async with asyncio.timeout(self.config.timeout_ms_request / 1000):
                return await self._http.send(request)
        except TimeoutError:
            # No headers sent means never sent only through httpx's own transport, which traces
            # them; any other (a test double, an in-process app, a wrapper) traces nothing, and its
            # silence says nothing (found by review: every late answer through one counted as
            # unsent, and the write went to the next node).
            if not sent and isinstance(self._http._transport_for_url(request.url), httpx.AsyncHTTPTransport):
                raise httpx.PoolTimeout(call_deadline_passed(self.config), request=request) from None
            raise httpx.ReadTimeout(call_deadline_passed(self.config), request=request) from None
