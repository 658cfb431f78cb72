"""Opening a LogStore from configuration: which backend, where it is, and its deadline.

Backends are imported only when chosen, so the embedded emulator never loads a cloud SDK.
`StoreConfig` is a plain, picklable value, so a test can hand it to other processes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from storage_adapters.errors import ValidationError
from storage_adapters.store import LogStore

BACKENDS = ("emulator", "redis", "azure_blob", "dynamodb")
TIMEOUT_MS_CALL_MAX = 600_000
# What a Redis must do before it answers a write: "aof", write it to its append-only file and fsync
# it (appendonly yes, appendfsync always; checked at open, storage_adapters/redis_store.py), since a
# vote Redis acknowledged and then lost on a restart lets a terminator log ABORT after COMMIT was
# returned; "replicas:N", have it on N replicas (the node sends WAIT after its writes: the managed
# services, which fsync nothing per write but replicate, lose an acknowledged write on a failover
# otherwise); "none", nothing checked (a benchmark, or a Redis whose durability the operator
# answers for otherwise), said in the log at open.
REDIS_DURABILITIES = ("aof", "replicas:N", "none")
# More replicas than any managed Redis offers a primary (ElastiCache: 5, Azure Cache: 3): a larger
# count is a typo, and every write would wait for replicas that do not exist.
REDIS_REPLICA_COUNT_MAX = 5
# How long past its deadline a request may still land, per backend (ProtocolConfig's
# late_write_window_ms). Redis's scripts and the emulator's writer refuse a call past its deadline
# themselves: 0. DynamoDB and Azure Blob check no deadline of ours; what ends a request's life there
# is its signature: SigV4 requests must reach AWS within 5 minutes of their timestamp (15 for some
# services). So a request held up in the network, a proxy or a retransmitting socket can land up
# to 15 minutes late, and garbage collection must leave tombstones that outlive that. Azure's
# requests carry signatures that expire at their deadline in Azure's time, which Azure checks on
# a request's arrival (storage_adapters/azure_signing.py); the window stays 15 minutes there all
# the same, for what that check leaves: a request's body, held up after its headers, may still
# commit later.
LATE_WRITE_WINDOW_MS = {"emulator": 0, "redis": 0, "azure_blob": 900_000, "dynamodb": 900_000}
# On Azure a fenced write must land before the lease its ownership blob grants ends: the blob's
# Last-Modified (whole seconds, truncated) plus lease_ms (storage_adapters/azure_signing.py). An
# owner's blob is up to a renewal interval old, so a lease must exceed the renewal interval by a
# second for that truncation and a second for the write to land, or most writes would find their
# window closed.
AZURE_LEASE_MARGIN_MS = 2_000
# The fields given as integers; the environment's strings are converted.
_INT_FIELDS = ("timeout_ms_call",)


@dataclass(frozen=True, slots=True)
class StoreConfig:
    backend: str = "emulator"
    timeout_ms_call: int = 5_000
    emulator_path: str = "cornus.db"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # What the Redis must guarantee before it answers a write (REDIS_DURABILITIES).
    redis_durability: str = "aof"
    azure_connection_string: str = ""
    azure_container: str = "cornus"
    dynamodb_table: str = "cornus"
    dynamodb_endpoint: str | None = None
    dynamodb_region: str = "us-east-1"
    # Injected latency (see storage_adapters.latency), e.g. "fixed:2" or "lognormal:10:30"; "" is none.
    latency: str = ""

    def __post_init__(self) -> None:
        # Every other field is a string (a TOML file may give anything): refused here, before
        # anything is opened, never a traceback later (found by audit).
        for name in _STR_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, str) and not (name in _OPTIONAL_FIELDS and value is None):
                raise ValidationError(f"storage {name} must be a string, got {value!r}")
        if self.latency:
            # Checked now, not when the store opens, by when its file or table was made (found by
            # audit); the module is imported only where a latency is asked for.
            from storage_adapters.latency import parse_latency

            parse_latency(self.latency)
        if self.backend not in BACKENDS:
            raise ValidationError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if not isinstance(self.timeout_ms_call, int) or not 0 < self.timeout_ms_call <= TIMEOUT_MS_CALL_MAX:
            raise ValidationError(f"timeout_ms_call must be an int in 1..{TIMEOUT_MS_CALL_MAX}")
        redis_replica_count(self.redis_durability)  # refuses a value that is none of them
        if self.backend == "azure_blob" and not self.azure_connection_string:
            raise ValidationError("backend azure_blob needs azure_connection_string")
        if self.backend == "azure_blob" and "sharedaccesssignature=" in self.azure_connection_string.lower():
            # A SAS of the user's may land until it expires, past any tombstone's keep
            # (LATE_WRITE_WINDOW_MS); the node signs each request itself (azure_signing).
            raise ValidationError(
                "azure_connection_string carries a SharedAccessSignature: use the account key (AccountKey=), "
                "with which the node signs each request for that request's deadline; a SAS request may land "
                "until the SAS expires, after the records it could recreate were collected"
            )

    @property
    def late_write_window_ms(self) -> int:
        """How long past its deadline a call to this backend may still land (LATE_WRITE_WINDOW_MS)."""
        return LATE_WRITE_WINDOW_MS[self.backend]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> StoreConfig:
        """Read `CORNUS_STORAGE_<FIELD>` variables (12-factor); keyword overrides (None: unset) win."""
        values: dict[str, object] = env_values(os.environ if environ is None else environ)
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)  # type: ignore[arg-type]

    def with_backend(self, backend: str) -> StoreConfig:
        return replace(self, backend=backend)


# The string fields (all but _INT_FIELDS), and those of them that may be None.
_STR_FIELDS = tuple(name for name in StoreConfig.__dataclass_fields__ if name not in _INT_FIELDS)
_OPTIONAL_FIELDS = ("dynamodb_endpoint",)


def redis_replica_count(durability: str) -> int:
    """How many replicas must have a write before the Redis store answers it: N of "replicas:N",
    0 for "aof" and "none"; ValidationError for anything else."""
    if not isinstance(durability, str):
        raise ValidationError(f"redis_durability must be a string (aof, none or replicas:N), got {durability!r}")
    if durability in ("aof", "none"):
        return 0
    # ASCII digits without a leading zero, as the chart's schema has it (str.isdigit takes "²").
    matched = re.fullmatch(r"replicas:([1-9][0-9]?)", durability, re.ASCII)
    if matched and int(matched[1]) <= REDIS_REPLICA_COUNT_MAX:
        return int(matched[1])
    raise ValidationError(f"redis_durability must be aof, none or replicas:N with N in 1..{REDIS_REPLICA_COUNT_MAX}, "
                          f"got {durability!r}")


def env_values(environ: Mapping[str, str]) -> dict[str, object]:
    """The StoreConfig fields that `CORNUS_STORAGE_<FIELD>` variables set, converted."""
    values: dict[str, object] = {}
    for name in StoreConfig.__dataclass_fields__:
        env_name = f"CORNUS_STORAGE_{name.upper()}"
        if env_name not in environ:
            continue
        raw = environ[env_name]
        if name in _INT_FIELDS:
            if not re.fullmatch(r"[0-9]+", raw):  # ASCII: str.isdigit takes "²", which int() refuses
                raise ValidationError(f"{env_name} must be an integer, got {raw!r}")
            values[name] = int(raw)
        else:
            values[name] = raw
    return values


async def open_store(config: StoreConfig) -> LogStore:
    """Connect to the configured backend (creating its container/table if needed)."""
    store: LogStore
    if config.backend == "emulator":
        from storage_adapters.emulator import EmulatorStore

        store = await EmulatorStore.open(config.emulator_path, timeout_ms_call=config.timeout_ms_call)
    elif config.backend == "redis":
        from storage_adapters.redis_store import RedisStore

        store = await RedisStore.open(config.redis_url, timeout_ms_call=config.timeout_ms_call,
                                      durability=config.redis_durability.partition(":")[0],
                                      replica_count=redis_replica_count(config.redis_durability))
    elif config.backend == "azure_blob":
        from storage_adapters.azure_blob import AzureBlobStore

        store = await AzureBlobStore.open(
            config.azure_connection_string,
            config.azure_container,
            timeout_ms_call=config.timeout_ms_call,
        )
    else:
        assert config.backend == "dynamodb"
        from storage_adapters.dynamodb import DynamoDbStore

        store = await DynamoDbStore.open(
            config.dynamodb_table,
            endpoint_url=config.dynamodb_endpoint,
            region=config.dynamodb_region,
            timeout_ms_call=config.timeout_ms_call,
        )
    if config.latency:
        from storage_adapters.latency import LatencyInjectingStore, parse_latency

        store = LatencyInjectingStore(store, parse_latency(config.latency))
    return store
