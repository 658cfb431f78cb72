"""scripts/azurite_blob.js: Azurite's blob service whose collection of unreferenced extents runs in
one pass. On a real Azurite with an in-memory store far smaller than what is written, collected
every half second: every write still lands (only collection makes room), every blob reads back
as last written, and the one-pass collection is what ran (its log line), as Azurite's own does
with CORNUS_AZURITE_GC_ONE_BY_ONE=1. How long each holds up requests:
scripts/azurite_gc_bench.py."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.storage.blob import BlobServiceClient

from tests.conftest import Services
from tests.worker import free_port

LAUNCHER = Path(__file__).resolve().parents[2] / "scripts" / "azurite_blob.js"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
EXTENT_MEMORY_MB = 1
BLOB_BYTES = 200 * 1024  # five fill the store: the writes below need collection to land
BLOB_COUNT = 3
ROUND_COUNT = 8
READY_TIMEOUT_S = 60.0


def _start(services: Services, tmp_path: Path, one_by_one: bool) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = free_port()
    log = tmp_path / f"azurite-{port}.log"
    environ = {**os.environ, "CORNUS_AZURITE_GC_INTERVAL_MS": "500", "CORNUS_AZURITE_GC_LOG": "1",
               "CORNUS_AZURITE_GC_ONE_BY_ONE": "1" if one_by_one else "0"}
    with log.open("wb") as out:
        server = subprocess.Popen(
            ["node", str(LAUNCHER), services.get("CORNUS_AZURITE_BLOB_BIN"), "--blobHost", "127.0.0.1",
             "--blobPort", str(port), "--inMemoryPersistence", "--extentMemoryLimit", str(EXTENT_MEMORY_MB),
             "--disableTelemetry", "--skipApiVersionCheck"],
            env=environ, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return server, port, log
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.fail(f"Azurite did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)


@pytest.fixture(params=[False, True], ids=["one_pass", "azurite_one_by_one"])
def azurite(request: pytest.FixtureRequest, services: Services, tmp_path: Path) -> Iterator[tuple[int, Path, bool]]:
    server, port, log = _start(services, tmp_path, request.param)
    try:
        yield port, log, request.param
    finally:
        server.kill()
        server.wait(timeout=10)


def test_collection_makes_room_and_keeps_what_blobs_refer_to(azurite: tuple[int, Path, bool]) -> None:
    port, log, one_by_one = azurite
    client = BlobServiceClient.from_connection_string(
        f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={ACCOUNT_KEY};"
        f"BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;")
    container = client.create_container("collected")
    written: dict[str, bytes] = {}
    for round_index in range(ROUND_COUNT):
        for blob in range(BLOB_COUNT):
            data = bytes([round_index]) * BLOB_BYTES
            deadline = time.monotonic() + 10
            while True:
                try:
                    container.upload_blob(f"b{blob}", data, overwrite=True)
                    break
                except Exception as error:  # the store is full until the next collection
                    if "size limit" not in str(error).lower() and "500" not in str(error):
                        raise
                    assert time.monotonic() < deadline, f"round {round_index}: no room made: {error}"
                    time.sleep(0.2)
            written[f"b{blob}"] = data
    # More than the store holds went through it: collection freed the rewritten blobs' extents.
    assert ROUND_COUNT * BLOB_COUNT * BLOB_BYTES > 4 * EXTENT_MEMORY_MB * 1024 * 1024
    for name, data in written.items():
        assert container.get_blob_client(name).download_blob().readall() == data, name
    one_pass = "azurite_blob.js: collected" in log.read_text()
    assert one_pass is not one_by_one, log.read_text()[-2000:]
