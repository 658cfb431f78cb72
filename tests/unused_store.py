"""A LogStore backend whose every I/O method fails the test if it is reached: the base for fake
backends that exercise the LogStore template (storage_adapters/store.py), each overriding only
the calls its test makes."""

from __future__ import annotations

from typing import Any

from storage_adapters.store import LogStore


class UnusedStore(LogStore):
    backend_name = "unused"

    async def _unused(self, *args: Any) -> Any:
        raise AssertionError(f"{type(self).__name__}: the test reached a backend call it does not use")

    _log_once = _log = _read = _scan_page = _scan_finished_page = _read_data = _unused
    _apply_redo = _delete = _read_owners = _write_owner = _list_identities = _unused

    async def close(self) -> None:
        pass
