"""The Cornus client SDK: `CornusClient` (sync, httpx.Client) and `AsyncCornusClient` (async,
httpx.AsyncClient) over the public REST API, with typed outcomes and errors, bounded retries with
capped exponential backoff and jitter, a deadline on every HTTP call, and transactions as context
managers. It depends on httpx only.

Values are text (str), stored as UTF-8. A value stored through the gRPC API that is not UTF-8 is
handed back as its exact bytes (`Outcome.binary_reads`, `get_bytes`, `Transaction.read_bytes`);
the calls that return text raise ValueNotText for it, naming the key, rather than other bytes.
"""

from services.client._core import ClientConfig
from services.client.aio import AsyncCornusClient, AsyncTransaction
from services.client.sync import CornusClient, Transaction
from services.client.types import (
    CornusError,
    InvalidRequest,
    NotFound,
    Op,
    OpKind,
    Outcome,
    OutcomeUnknown,
    PartitionInfo,
    PartitionListing,
    RequestError,
    ServerError,
    Status,
    TextReads,
    TransactionAborted,
    TransactionFailed,
    TxnInfo,
    Unavailable,
    ValueNotText,
    WrongState,
)

__all__ = [
    "AsyncCornusClient",
    "AsyncTransaction",
    "ClientConfig",
    "CornusClient",
    "CornusError",
    "InvalidRequest",
    "NotFound",
    "Op",
    "OpKind",
    "Outcome",
    "OutcomeUnknown",
    "PartitionInfo",
    "PartitionListing",
    "RequestError",
    "ServerError",
    "Status",
    "TextReads",
    "Transaction",
    "TransactionAborted",
    "TransactionFailed",
    "TxnInfo",
    "Unavailable",
    "ValueNotText",
    "WrongState",
]
