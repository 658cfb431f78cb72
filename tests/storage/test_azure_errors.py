"""How the Azure Blob store answers a service that breaks off mid-answer: as storage unavailable,
never as an error the node takes for an impossible state (and exits on)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from storage_adapters.azure_blob import AzureBlobStore
from storage_adapters.contract import LogId, RecordBody, Tombstone, TxnState
from storage_adapters.errors import StorageError, StorageUnavailable
from tests.conftest import Services
from tests.worker import free_port

# Azurite's well-known development account (a public test key, not a secret).
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
TIMEOUT_MS_CALL = 10_000


async def _fake_azure(port: int, answer: Callable[[bytes, bytes], tuple[bytes, bool]]) -> asyncio.Server:
    """A server on `port` that reads each request (its head and body) and writes what `answer`
    makes of its head and request line; the connection stays open while `answer` says so."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            keep_open = True
            while keep_open:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                response, keep_open = answer(head, head.split(b"\r\n", 1)[0])
                writer.write(response)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", port)


def _truncating(head: bytes, request_line: bytes) -> tuple[bytes, bool]:
    """Creates the container, then answers every request with a body cut short: headers that
    promise 1,000 bytes, 10 of them, and the connection closed."""
    if head.startswith(b"PUT ") and b"restype=container" in request_line:
        return b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\nx-ms-version: 2021-08-06\r\n\r\n", False
    if head.startswith(b"GET ") and b"comp=list" not in request_line:  # a blob's download
        return (b"HTTP/1.1 206 Partial Content\r\nContent-Length: 1000\r\n"
                b"Content-Range: bytes 0-999/1000\r\nx-ms-version: 2021-08-06\r\nETag: \"0x1\"\r\n"
                b"x-ms-blob-type: BlockBlob\r\n\r\n0123456789"), False
    return (b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nContent-Type: application/xml\r\n"
            b"x-ms-version: 2021-08-06\r\nETag: \"0x1\"\r\n\r\n<?xml vers"), False


@pytest.fixture
async def truncated() -> AsyncIterator[AzureBlobStore]:
    port = free_port()
    server = await _fake_azure(port, _truncating)
    connection_string = (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                         f"BlobEndpoint=http://127.0.0.1:{port}/{ACCOUNT};")
    store = await AzureBlobStore.open(connection_string, "truncated", timeout_ms_call=TIMEOUT_MS_CALL)
    try:
        yield store
    finally:
        await store.close()
        server.close()


async def test_a_body_cut_short_is_storage_unavailable(truncated: AzureBlobStore) -> None:
    """Found by review: azure-core reports a body cut short (aiohttp's ClientPayloadError) as an
    HttpResponseError without a response, whose missing error_code made the store's own error
    mapping raise AttributeError, and the node exited (a listing backs recovery scans and the
    ownership loop's reads; a download every record read)."""
    log = LogId.partition("p")
    for call in (lambda: truncated.scan_unfinished(log, limit=10), lambda: truncated.read(log, "t1"),
                 lambda: truncated.read_owners([f"p{index}" for index in range(40)])):
        with pytest.raises(StorageUnavailable):
            await call()


def _refusing(puts: list[bytes]) -> Callable[[bytes, bytes], tuple[bytes, bool]]:
    """Creates the container, finds no blob, and refuses every Put Blob with a 409 that is no
    precondition lost: what an account with a hierarchical namespace answers a put with index tags."""
    common = b"x-ms-version: 2021-08-06\r\nContent-Length: 0\r\n"

    def answer(head: bytes, request_line: bytes) -> tuple[bytes, bool]:
        if head.startswith(b"PUT ") and b"restype=container" in request_line:
            return b"HTTP/1.1 201 Created\r\n" + common + b"\r\n", True
        if head.startswith(b"PUT "):
            puts.append(request_line)
            return (b"HTTP/1.1 409 Conflict\r\n" + common
                    + b"x-ms-error-code: FeatureNotYetSupportedForHierarchicalNamespaceAccounts\r\n\r\n"), True
        return b"HTTP/1.1 404 Not Found\r\n" + common + b"x-ms-error-code: BlobNotFound\r\n\r\n", True

    return answer


async def test_a_conflict_that_is_no_lost_race_is_not_retried_as_one() -> None:
    """Found by review: every 409 to a conditional put was taken for a lost ETag race, so a keep
    refused for good (index tags on a hierarchical-namespace account, an immutability policy) was
    read and put again 16 times, then reported as "unavailable", and garbage collection, which
    deletes nothing until the tombstone stands, retried it for ever. It is the error it is."""
    port, puts = free_port(), []
    server = await _fake_azure(port, _refusing(puts))
    connection_string = (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                         f"BlobEndpoint=http://127.0.0.1:{port}/{ACCOUNT};")
    store = await AzureBlobStore.open(connection_string, "refusing", timeout_ms_call=TIMEOUT_MS_CALL)
    try:
        with pytest.raises(StorageError) as refused:
            await store.delete(LogId.partition("p"), "t1", keep=Tombstone(TxnState.COMMIT, 60_000))
        assert not isinstance(refused.value, StorageUnavailable), refused.value
        assert "FeatureNotYetSupported" in str(refused.value), refused.value
        assert len(puts) == 1, puts
        with pytest.raises(StorageError) as refused:
            await store.log_once(LogId.partition("p"), "t2", TxnState.VOTE_YES, RecordBody())
        assert not isinstance(refused.value, StorageUnavailable), refused.value
    finally:
        await store.close()
        server.close()


@pytest.mark.services
async def test_a_missing_container_is_an_error_never_an_absent_record(services: Services) -> None:
    """Found by audit (2026-11-27): every 404 read as "no such blob", ContainerNotFound too (the
    container deleted, or a wrong name where the node does not create it): a record, an owner or
    a data key read as absent, and a fence check as a partition nobody holds, so the node dropped
    its partitions as if deposed while its writes failed. Only BlobNotFound means absent."""
    container = f"gone-{uuid.uuid4().hex[:10]}"
    store = await AzureBlobStore.open(services.azure_connection_string, container, timeout_ms_call=TIMEOUT_MS_CALL)
    log = LogId.partition("p0")
    try:
        await store.delete_container()
        reads: list[Callable[[], Awaitable[object]]] = [
            lambda: store.read(log, "t1"),
            lambda: store.read_data("p0", ["k1"]),
            lambda: store.read_owners(("p0",)),
            lambda: store.delete(log, "t1"),
        ]
        for read in reads:
            with pytest.raises(StorageError, match="ContainerNotFound"):
                await read()
    finally:
        await store.close()


@pytest.mark.services
async def test_a_lost_create_whose_winner_is_gone_on_the_read_back_is_unavailable(
        services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by audit (2026-11-27): log_once's loser reads the winning blob back and asserted it was
    there; the tombstone sweep may delete an expired tombstone between the 409 and that read, and
    the AssertionError, no storage error, took the node down. Nothing was written: unavailable."""
    container = f"race-{uuid.uuid4().hex[:10]}"
    store = await AzureBlobStore.open(services.azure_connection_string, container, timeout_ms_call=TIMEOUT_MS_CALL)

    async def lost(*_: object) -> bool:
        return False

    async def gone(*_: object) -> None:
        return None

    monkeypatch.setattr(store, "_create", lost)
    monkeypatch.setattr(store, "_get", gone)
    log = LogId.partition("p0")
    try:
        with pytest.raises(StorageUnavailable, match="read back"):
            await store.log_once(log, "t1", TxnState.VOTE_YES, RecordBody(("p0",), "n1", b""))
    finally:
        monkeypatch.undo()
        await store.delete_container()
        await store.close()
