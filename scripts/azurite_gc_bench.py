"""How long Azurite's garbage collection of unreferenced extents holds up its requests, with Azurite's
own one-by-one deletes and with scripts/azurite_blob.js's single pass: a private Azurite each, N
blobs written three times over (each rewrite leaves an extent to collect), then a small read every
50 ms through the next collection; prints the longest and the collection's time. A figure to read.

    python3 scripts/azurite_gc_bench.py [--blobs 5000]   # with the test services' env (.services/env)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from azure.core.exceptions import AzureError
from azure.storage.blob import BlobServiceClient
from local_server import free_port, running

LAUNCHER = Path(__file__).with_name("azurite_blob.js")
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
GC_INTERVAL_MS = 60_000
WRITE_THREADS = 4
# How long a frozen Azurite is watched: Azurite's own collection of 10,000 extents froze it past 4
# minutes here (2026-11-28) and was stopped; the figure is "at least" past this.
FREEZE_WATCH_S_MAX = 300.0


def _azurite_bin() -> str:
    env_file = Path(__file__).resolve().parents[1] / ".services" / "env"
    for line in env_file.read_text().splitlines():
        if line.startswith("CORNUS_AZURITE_BLOB_BIN="):
            return line.split("=", 1)[1].strip("'\"")
    raise SystemExit(f"no CORNUS_AZURITE_BLOB_BIN in {env_file}: run scripts/services.sh up")


def _run(one_by_one: bool, blobs: int) -> None:
    port = free_port()
    environ = {**os.environ, "CORNUS_AZURITE_GC_INTERVAL_MS": str(GC_INTERVAL_MS),
               "CORNUS_AZURITE_GC_ONE_BY_ONE": "1" if one_by_one else "0"}
    argv = ["node", str(LAUNCHER), _azurite_bin(), "--blobHost", "127.0.0.1", "--blobPort", str(port),
            "--inMemoryPersistence", "--disableTelemetry", "--skipApiVersionCheck", "--silent"]
    with running(argv, port, environ):
        # The first collection runs at the start, on nothing; the next GC_INTERVAL_MS after it ends.
        collection_at = time.monotonic() + GC_INTERVAL_MS / 1000
        client = BlobServiceClient.from_connection_string(
            f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={ACCOUNT_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;")
        container = client.create_container("collected")

        def write(index: int) -> None:
            for version in range(3):
                container.upload_blob(f"blob{index}", f"{version}".encode() * 64, overwrite=True)

        with ThreadPoolExecutor(WRITE_THREADS) as pool:
            list(pool.map(write, range(blobs)))
        if time.monotonic() > collection_at:
            raise SystemExit(f"writing {blobs} blobs took past the collection: lower --blobs")
        probe = container.get_blob_client("blob0")
        longest_s, slow_since, slow_s, took_s = 0.0, None, 0.0, 0.0
        while (time.monotonic() < collection_at + 5 or slow_since is not None) and (
                time.monotonic() < collection_at + FREEZE_WATCH_S_MAX):
            asked = time.monotonic()
            # The client's own read timeout (60 s) counts as the time it waited.
            with contextlib.suppress(AzureError):
                probe.download_blob().readall()
            took_s = time.monotonic() - asked
            longest_s = max(longest_s, took_s)
            if took_s > 0.5:
                slow_since = slow_since or asked
                slow_s = time.monotonic() - slow_since
            elif slow_since is not None and time.monotonic() > collection_at + 5:
                break
            time.sleep(0.05)
        label = "Azurite's own deletes" if one_by_one else "one pass (azurite_blob.js)"
        print(f"{label}: {blobs} blobs x3 writes: longest read during the collection {1000 * longest_s:.0f} ms; "
              f"reads over 0.5 s for {slow_s:.1f} s"
              f"{' (still frozen: stopped watching)' if took_s > 0.5 else ''}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blobs", type=int, default=5_000)
    args = parser.parse_args()
    if args.blobs < 1:
        parser.error("--blobs must be at least 1")
    for one_by_one in (False, True):
        _run(one_by_one, args.blobs)


if __name__ == "__main__":
    main()
