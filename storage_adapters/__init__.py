"""Storage adapters: the LogStore contract (contract.py: value types and rules; store.py: the
template every backend fills in) and its backends (emulator, redis, azure_blob, dynamodb).

Import from the modules themselves. This package imports nothing, so that the protocol core,
which imports contract.py's value types, does not load asyncio through store.py."""
