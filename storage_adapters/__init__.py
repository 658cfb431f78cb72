"""Storage adapters: the LogStore contract and its backends (emulator, redis, azure_blob, dynamodb)."""

from storage_adapters.contract import (
    LogId,
    LogKind,
    LogOnceResult,
    LogStore,
    Record,
    RecordBody,
    TxnState,
)
from storage_adapters.errors import (
    DecisionFlipRefused,
    InvariantViolation,
    StorageError,
    StorageUnavailable,
    ValidationError,
)

__all__ = [
    "DecisionFlipRefused",
    "InvariantViolation",
    "LogId",
    "LogKind",
    "LogOnceResult",
    "LogStore",
    "Record",
    "RecordBody",
    "StorageError",
    "StorageUnavailable",
    "TxnState",
    "ValidationError",
]
