"""Lock table cost per transaction beside many held locks: `python -m tests.protocol.bench_locks`.

Prints figures, asserts nothing about speed. Release and expiry must cost what the transaction
touched, not what the whole partition holds (they run once per transaction)."""

from __future__ import annotations

import time

from cornus.protocol.locks import LockMode, LockTable

HELD_TXN_COUNT = 2_000
KEYS_PER_TXN = 8
MEASURED_TXN_COUNT = 5_000


def main() -> None:
    table = LockTable()
    for txn in range(HELD_TXN_COUNT):
        for key in range(KEYS_PER_TXN):
            table.acquire(f"held-{txn}", f"held-{txn}-{key}", LockMode.EXCLUSIVE, txn, 0)
    started = time.perf_counter()
    for txn in range(MEASURED_TXN_COUNT):
        for key in range(KEYS_PER_TXN):
            table.acquire(f"t-{txn}", f"t-{txn}-{key}", LockMode.EXCLUSIVE, txn, 0)
        table.release(f"t-{txn}")
    elapsed_us = (time.perf_counter() - started) / MEASURED_TXN_COUNT * 1e6
    print(f"{KEYS_PER_TXN} locks taken and released per transaction beside {HELD_TXN_COUNT * KEYS_PER_TXN} held "
          f"locks: {elapsed_us:.1f} us per transaction ({MEASURED_TXN_COUNT} transactions)")


if __name__ == "__main__":
    main()
