"""The storage of one bench run of its own: each protocol (and each point of a sweep) runs where
what an earlier run left behind (records that wait for garbage collection, data) cannot weigh on
its measurement. The emulator: a file in the run's directory. Azure Blob and DynamoDB: a container
or table named after the one the user gave, `<name>-<protocol><point>` (cornus-cornus0,
cornus-2pc1, ...). Redis has only numbered databases: each protocol gets its own, the URL's and the
next two, and the runs of a sweep reuse them (`--flush-redis` empties them first).

A container or table the run's nodes created is deleted when the run ends, unless the user asked
to keep it (--keep-storage); one that existed before the run is the user's and stays.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from cornus.protocol.config import Protocol
from loadtests.bench import cloud
from storage_adapters.errors import ValidationError
from storage_adapters.factory import StoreConfig

# Deadline of the Redis flush of --flush-redis: one FLUSHDB of a benchmark database.
FLUSH_TIMEOUT_S = 15.0


@dataclass
class RunStorage:
    """Where one run's nodes keep their records and data."""

    storage: StoreConfig
    argv: list[str]  # the flags that point the nodes there
    cloud_name: str = ""  # the container or table, "" on the emulator and Redis
    existed: bool = True  # it was there before the run (so it is not the run's to delete)


def run_storage(storage: StoreConfig, protocol: Protocol, data: Path, run_index: int = 0) -> RunStorage:
    """The storage of run `run_index` (sweep point times trials, plus the trial) of `protocol`;
    nothing is created yet."""
    index = list(Protocol).index(protocol)
    if storage.backend == "emulator":
        return RunStorage(storage, ["--emulator-path", str(data / "cornus.db")])
    if storage.backend == "redis":
        base, _, db = storage.redis_url.rpartition("/")
        if not db.isdigit():
            raise ValidationError("bench on redis needs a URL ending in a database number, e.g. "
                                  "redis://host:6379/0; the protocols use that database and the next two")
        return RunStorage(storage, ["--redis-url", f"{base}/{int(db) + index}"])
    suffix = f"{protocol.value.replace('-', '')}{run_index}"
    if storage.backend == "azure_blob":
        name = f"{storage.azure_container}-{suffix}"
        return RunStorage(storage, ["--azure-container", name], name)
    name = f"{storage.dynamodb_table}-{suffix}"
    return RunStorage(storage, ["--dynamodb-table", name], name)


def prepare(run: RunStorage, *, flush_redis: bool = False) -> None:
    """Before the nodes start: note whether the run's container or table is already there (the
    user's), and with `flush_redis` empty the run's Redis database (the user named it as theirs
    to use)."""
    if run.cloud_name:
        try:
            run.existed = cloud.exists(run.storage, run.cloud_name)
        except Exception as error:  # any SDK or network error: the run cannot start, said in one line
            raise RuntimeError(f"could not ask {run.storage.backend} whether {_kind(run)} {run.cloud_name} exists "
                               f"({type(error).__name__}: {error})") from error
    elif flush_redis and run.storage.backend == "redis":
        _flush_redis(run.argv[1])


def release(run: RunStorage, *, keep: bool = False) -> None:
    """After the nodes stopped: delete the container or table the run created, unless `keep`. A
    delete that fails is said on stderr, not raised: the measurement stands, and the line names
    what to delete by hand."""
    if not run.cloud_name or run.existed or keep:
        return
    try:
        cloud.delete(run.storage, run.cloud_name)
    except Exception as error:  # any SDK or network error: reported, the run's result kept
        print(f"cornus: could not delete the bench's {_kind(run)} {run.cloud_name} ({type(error).__name__}: {error}); "
              "delete it yourself", file=sys.stderr, flush=True)


def _kind(run: RunStorage) -> str:
    return "container" if run.storage.backend == "azure_blob" else "table"


def _flush_redis(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=FLUSH_TIMEOUT_S, socket_connect_timeout=FLUSH_TIMEOUT_S)
    try:
        client.flushdb()
    finally:
        client.close()
