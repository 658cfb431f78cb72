"""The cloud stores' error mapping: a service condition that passes by itself is StorageUnavailable
(the caller retries), never a plain error, which the node takes for an impossible state and exits
on (cornus.runtime.effect_runner.fatal). Constructed errors, as the SDK raises them."""

from __future__ import annotations

import contextlib

import pytest
from botocore.exceptions import ClientError, CredentialRetrievalError, NoCredentialsError
from botocore.parsers import ResponseParserError

from storage_adapters.dynamodb import DynamoDbStore
from storage_adapters.errors import StorageError, StorageUnavailable


def _client_error(code: str, status: int = 400) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "TransactWriteItems")


@pytest.mark.parametrize("error", [
    _client_error("ExpiredTokenException"),
    _client_error("InvalidSignatureException"),
    _client_error("ReplicatedWriteConflictException"),
    _client_error("RequestTimeoutException"),
    _client_error("ThrottlingException"),
    _client_error("SomethingNew", 503),
    NoCredentialsError(),
    CredentialRetrievalError(provider="container-role", error_msg="timed out"),
    ResponseParserError("unable to parse the answer"),
], ids=lambda error: type(error).__name__ + (f"-{error.response['Error']['Code']}" if isinstance(error, ClientError)
                                             else ""))
def test_dynamodb_conditions_that_pass_are_unavailable(error: Exception) -> None:
    store = DynamoDbStore(None, contextlib.AsyncExitStack(), "table", 1000)
    assert isinstance(store._storage_error(error, "log_once"), StorageUnavailable)


@pytest.mark.parametrize("error", [_client_error("ValidationException"), _client_error("AccessDeniedException")])
def test_dynamodb_refusals_that_stay_stay_plain_errors(error: Exception) -> None:
    store = DynamoDbStore(None, contextlib.AsyncExitStack(), "table", 1000)
    mapped = store._storage_error(error, "log_once")
    assert isinstance(mapped, StorageError) and not isinstance(mapped, StorageUnavailable)
