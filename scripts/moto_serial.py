"""Runs moto's server (the DynamoDB double the tests use) with one request at a time.

moto's `moto_server` serves each request on its own thread, but its DynamoDB backend is not safe
for that: `TransactWriteItems` deep-copies every table it touches as a rollback backup, so a
concurrent write to the same table makes the copy fail ("dictionary changed size during
iteration", answered as HTTP 500), and a rollback restores a copy that predates the other
thread's write, silently undoing it. Real DynamoDB has neither fault, so the suite must not see
them. This wraps moto's application in a lock and otherwise starts it as `moto_server` does;
threads still accept connections, so a client's idle keep-alive connection never blocks another.

And its TransactWriteItems keeps a backup of only the items it touches (`_ItemBackups`), not of
every table it names. Moto's whole-table deep copy cost time and memory in the size of the table,
and kept every copy: with 5,000 items a call took 127-205 ms and the server grew by 7-9 MB a call
(2.8 GB in 300 calls), so a long DynamoDB run slowed to a crawl and was OOM-killed at 23.9 GB (the chaos
tool, 2026-11-28), and the cluster tests ran DynamoDB only on request. Serialized as above, a
transaction's items are all anyone changes while it runs, so restoring them is the same rollback.
`python3 scripts/moto_transact_bench.py` prints a call's time and the server's growth, both ways.

And it deletes expired items, as DynamoDB's TTL does (`expire_items`, every TTL_SWEEP_INTERVAL_S
seconds; CORNUS_MOTO_TTL_SWEEP_S overrides it, 0 turns it off): moto never does, so every tombstone
ever written stayed, and since moto's Query walks every item of a key, a DynamoDB chaos run's calls
slowed until nodes could not renew their leases (seed 33, 2026-11-28: "not ready after the faults",
every call past its 2 s deadline after 18 minutes). DynamoDB deletes an expired item at some time
after it expires (typically within days), and readers must treat an expired item that is still
there as gone; deleting it at once is one of the behaviours it allows.

Usage: python3 scripts/moto_serial.py -H 127.0.0.1 -p PORT [--whole-table-backups]
(the option keeps moto's own backups: for comparing the two, tests/storage/test_moto_serial.py)
"""

from __future__ import annotations

import argparse
import copy
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import moto.dynamodb.models as dynamodb_models
from moto.dynamodb.models import DynamoDBBackend, dynamodb_backends
from moto.dynamodb.models.dynamo_type import DynamoType, Item
from moto.dynamodb.models.table import Table
from moto.moto_server.threaded_moto_server import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


# How often expired items are deleted: often enough that a table holds little more than its
# unexpired items, seldom enough that the walk over every item (under the lock) costs little.
TTL_SWEEP_INTERVAL_S = 10.0


class SerialApp:
    """A WSGI middleware that lets one request at a time into `app`, body included."""

    def __init__(self, app: WsgiApp) -> None:
        self._app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with self.lock:
            # The body is built inside the lock: a lazy iterable would read moto's state after it.
            return list(self._app(environ, start_response))


class _ItemBackups:
    """The items one TransactWriteItems names, as they were before it: restored, on any failure,
    exactly as moto's own backup of their tables would have restored them (the others it left
    alone). Each is a deep copy (moto's UpdateItem changes an item in place)."""

    def __init__(self, backend: DynamoDBBackend, transact_items: list[dict[str, Any]]) -> None:
        self._saved: list[tuple[Table, DynamoType, DynamoType | None, Item | None]] = []
        for entry in transact_items:
            _, op = next(iter(entry.items()))
            table = backend.tables.get(op.get("TableName"))
            if table is None:
                continue  # moto refuses it before any write
            key = op["Item"] if "Item" in op else op["Key"]
            hash_key = DynamoType(key[table.hash_key_attr])
            range_key = DynamoType(key[table.range_key_attr]) if table.range_key_attr is not None else None
            self._saved.append((table, hash_key, range_key, copy.deepcopy(table.get_item(hash_key, range_key))))

    def restore(self) -> None:
        # In reverse: an item named twice (which moto refuses) ends as it was first found.
        for table, hash_key, range_key, item in reversed(self._saved):
            if range_key is None:
                if item is None:
                    table.items.pop(hash_key, None)
                else:
                    table.items[hash_key] = item
            elif item is None:
                table.items[hash_key].pop(range_key, None)
            else:
                table.items[hash_key][range_key] = item


class _CopyModule:
    """What moto's DynamoDB models see as `copy`: a table "copied" by its own TransactWriteItems is
    the table itself, so that backup is a no-op, and so is its rollback, which _ItemBackups does
    instead; unless `tables_copied` (a request whose items _ItemBackups could not read, a malformed
    one, which moto may refuse only after it wrote the items before it)."""

    tables_copied = False

    def deepcopy(self, value: Any, memo: dict[int, Any] | None = None) -> Any:
        return value if isinstance(value, Table) and not self.tables_copied else copy.deepcopy(value, memo)


_copy_module = _CopyModule()


def patch_transactions() -> None:
    """Make moto's TransactWriteItems back up only the items it names (see the module's text)."""
    original = DynamoDBBackend.transact_write_items
    if getattr(original, "backs_up_items", False):
        return
    dynamodb_models.copy = _copy_module  # type: ignore[attr-defined]

    def transact_write_items(self: DynamoDBBackend, transact_items: list[dict[str, Any]]) -> None:
        try:
            backups = _ItemBackups(self, transact_items)
        except Exception:
            # Malformed: moto's own code says what is wrong, with its own backup (one request at
            # a time: no other sees the flag).
            _copy_module.tables_copied = True
            try:
                return original(self, transact_items)
            finally:
                _copy_module.tables_copied = False
        try:
            return original(self, transact_items)
        except BaseException:
            backups.restore()
            raise

    transact_write_items.backs_up_items = True  # type: ignore[attr-defined]
    DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]


def expire_items(now_s: float) -> int:
    """Delete every item whose TTL attribute (a number of seconds since the epoch) is before
    `now_s`, in every table with TTL enabled, as DynamoDB eventually does; the count deleted. The
    caller holds the request lock."""
    deleted = 0
    for _, _, backend in dynamodb_backends.iter_backends():
        for table in list(backend.tables.values()):
            attribute = table.ttl.get("AttributeName")
            if table.ttl.get("TimeToLiveStatus") != "ENABLED" or not attribute:
                continue
            for hash_key, held in list(table.items.items()):
                for item in list(held.values()) if table.has_range_key else [held]:
                    expires = item.attrs.get(attribute)
                    # DynamoDB ignores an attribute that is not a number, as here.
                    if expires is not None and expires.type == "N" and float(expires.value) < now_s:
                        table.delete_item(hash_key, item.range_key if table.has_range_key else None)
                        deleted += 1
                if table.has_range_key and not table.items.get(hash_key, True):
                    del table.items[hash_key]  # its last item went (moto's own deletes leave it empty)
    return deleted


def _expire_items_forever(app: SerialApp, interval_s: float) -> None:
    while True:
        time.sleep(interval_s)
        with app.lock:
            try:
                expire_items(time.time())
            except Exception as error:  # a moto whose models changed: said, and tried again
                print(f"moto_serial.py: deleting expired items failed: {type(error).__name__}: {error}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    parser.add_argument("--whole-table-backups", action="store_true",
                        help="keep moto's own TransactWriteItems (a deep copy of every table it names)")
    args = parser.parse_args()
    # moto builds some response URLs from this, as its own launcher sets it.
    os.environ.setdefault("MOTO_PORT", str(args.port))
    if not args.whole_table_backups:
        patch_transactions()
    app = SerialApp(DomainDispatcherApplication(create_backend_app))
    setting = os.environ.get("CORNUS_MOTO_TTL_SWEEP_S", str(TTL_SWEEP_INTERVAL_S))
    try:
        interval_s = float(setting)
    except ValueError:
        interval_s = -1.0
    if not interval_s >= 0:  # NaN too
        parser.error(f"CORNUS_MOTO_TTL_SWEEP_S must be a number of seconds, 0 (off) or more, got {setting!r}")
    if interval_s:
        threading.Thread(target=_expire_items_forever, args=(app, interval_s), daemon=True).start()
    run_simple(args.host, args.port, app, threaded=True)


if __name__ == "__main__":
    main()
