"""Whether an Azure Blob container or a DynamoDB table exists, and deleting one: what the bench
needs to remove the containers and tables its runs created (loadtests.bench.namespaces). Calls the
SDKs directly, with the credentials the nodes use (storage_adapters opens them the same way), one
named container or table at a time: never a listing, which on an emulator holding thousands of
containers can take minutes.
"""

from __future__ import annotations

import contextlib
from typing import Any
from urllib.parse import urlsplit

from storage_adapters.factory import StoreConfig

# Deadline of each call: a probe or a delete is one small request.
CLOUD_TIMEOUT_S_CALL = 30.0
# Attempts of each call: one retry rides out a dropped connection; a service that does not answer
# twice is down, and the SDKs' own defaults (4 and 5 attempts) would keep the user waiting minutes.
CLOUD_ATTEMPT_COUNT_MAX = 2
# Local emulators (moto, DynamoDB Local) accept any credentials but botocore insists on some, and
# moto keys its accounts by them: these are the ones storage_adapters.dynamodb gives the nodes.
_LOCAL_DYNAMODB_CREDENTIALS = ("testing", "testing")
_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def exists(storage: StoreConfig, name: str) -> bool:
    """Whether container (azure_blob) or table (dynamodb) `name` exists."""
    if storage.backend == "azure_blob":
        return bool(_container(storage, name).exists(timeout=CLOUD_TIMEOUT_S_CALL))
    from botocore.exceptions import ClientError

    try:
        _dynamodb(storage).describe_table(TableName=name)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
            return False
        raise
    return True


def delete(storage: StoreConfig, name: str) -> None:
    """Delete container or table `name`; one already gone is fine."""
    if storage.backend == "azure_blob":
        from azure.core.exceptions import ResourceNotFoundError

        with contextlib.suppress(ResourceNotFoundError):
            _container(storage, name).delete_container(timeout=CLOUD_TIMEOUT_S_CALL)
        return
    from botocore.exceptions import ClientError

    try:
        _dynamodb(storage).delete_table(TableName=name)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
            raise


def _container(storage: StoreConfig, name: str) -> Any:
    from azure.storage.blob import BlobServiceClient

    service = BlobServiceClient.from_connection_string(
        storage.azure_connection_string, connection_timeout=CLOUD_TIMEOUT_S_CALL, read_timeout=CLOUD_TIMEOUT_S_CALL,
        retry_total=CLOUD_ATTEMPT_COUNT_MAX - 1)
    return service.get_container_client(name)


def _dynamodb(storage: StoreConfig) -> Any:
    import botocore.session
    from botocore.config import Config

    local = storage.dynamodb_endpoint is not None and urlsplit(storage.dynamodb_endpoint).hostname in _LOCAL_HOSTS
    key_id, secret = _LOCAL_DYNAMODB_CREDENTIALS if local else (None, None)
    return botocore.session.get_session().create_client(
        "dynamodb", endpoint_url=storage.dynamodb_endpoint, region_name=storage.dynamodb_region,
        aws_access_key_id=key_id, aws_secret_access_key=secret,
        config=Config(connect_timeout=CLOUD_TIMEOUT_S_CALL, read_timeout=CLOUD_TIMEOUT_S_CALL,
                      retries={"total_max_attempts": CLOUD_ATTEMPT_COUNT_MAX, "mode": "standard"}))
