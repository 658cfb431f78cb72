"""The Cornus client SDK: `CornusClient` (sync, httpx.Client) and `AsyncCornusClient` (async,
httpx.AsyncClient) over the public REST API, with typed outcomes and errors, bounded retries with
capped exponential backoff and jitter, a deadline on every HTTP call, and transactions as context
managers. It depends on httpx only.
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
    TransactionAborted,
    TransactionFailed,
    TxnInfo,
    Unavailable,
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
    "Transaction",
    "TransactionAborted",
    "TransactionFailed",
    "TxnInfo",
    "Unavailable",
    "WrongState",
]
