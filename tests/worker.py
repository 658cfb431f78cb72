"""What this pytest process owns when pytest-xdist runs the suite in several worker processes: its
slice of loopback ports and its Redis database. Without xdist the process is worker 0 of 1.

Workers share one redis-server, one Azurite and one moto (scripts/services.sh) and one loopback
interface. Names that tests make unique themselves (uuid prefixes, tmp_path) need nothing more;
what they cannot make unique (a database that a fixture empties, a port a server binds after the
allocator let go of it) is split here by worker index.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path
from typing import TextIO

# Ports handed to servers that a test kills and restarts on the same port come from below the
# kernel's ephemeral range (32768-60999 on Linux): a port from that range, left free while its
# server is down, can be taken as the source port of any outgoing connection meanwhile. And from
# below the ports local clusters (cornus bench, cluster up, started by tests too) draw from, just
# under that range (services.local_cluster.stable_port_range, 26768-32768 here), which could
# otherwise take a port a test's node left free while it restarted.
STABLE_PORT_RANGE = (14_000, 26_000)
_PORT_ATTEMPT_COUNT_MAX = 1_000
_rng = random.Random()


def worker_index() -> int:
    """0-based index of this xdist worker ("gw3" is 3); 0 when the suite runs in one process."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name.removeprefix("gw")) if name.startswith("gw") else 0


def worker_count() -> int:
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def port_slice(index: int, count: int) -> tuple[int, int]:
    """[low, high) of the stable range that worker `index` of `count` allocates from: disjoint
    slices, so a port one worker probed free and let go is never handed out by another before
    its server binds it."""
    low, high = STABLE_PORT_RANGE
    width = (high - low) // count
    assert width > 0, f"{count} workers cannot share {high - low} ports"
    return low + index * width, low + (index + 1) * width


class _PortCursor:
    """Walks this worker's slice from a random start. Walking (rather than drawing at random)
    never hands out a port twice until the slice wraps, so ports given to one cluster cannot
    repeat even before their servers bind them; the random start keeps concurrent suites of other
    checkouts on this machine, which walk the same slices, from stepping in lockstep with us."""

    def __init__(self) -> None:
        self._slice: tuple[int, int] | None = None
        self._next = 0

    def take(self) -> int:
        bounds = port_slice(worker_index(), worker_count())
        if bounds != self._slice:
            self._slice = bounds
            self._next = _rng.randrange(*bounds)
        low, high = bounds
        for _ in range(min(_PORT_ATTEMPT_COUNT_MAX, high - low)):
            port = self._next
            self._next = low + (self._next + 1 - low) % (high - low)
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
        raise RuntimeError(f"no free port in {bounds} after {_PORT_ATTEMPT_COUNT_MAX} attempts")


_cursor = _PortCursor()


def free_port() -> int:
    """A loopback port that is free now and that no other worker of this run will hand out."""
    return _cursor.take()


# Redis database 0 holds the conformance suite's records (unique key prefixes per test, never
# flushed); cluster tests empty their database before each test, so each worker has its own.
REDIS_DB_CLUSTER_FIRST = 1
# scripts/services.sh starts redis-server with this many databases.
REDIS_DB_COUNT = 256
# A worker's databases: the cluster tests' one, then the bench's three (redis_db_bench).
REDIS_DB_PER_WORKER = 4
# Workers one run may have.
REDIS_WORKER_COUNT_MAX = 8
# Databases one run takes. Two runs on one machine (a CI clone beside a developer's run, two
# checkouts) share the redis-server, so each run takes a slot of databases of its own, or one
# would empty the other's mid-test.
REDIS_DB_SLOT_WIDTH = REDIS_DB_PER_WORKER * REDIS_WORKER_COUNT_MAX
REDIS_DB_SLOT_COUNT = (REDIS_DB_COUNT - REDIS_DB_CLUSTER_FIRST) // REDIS_DB_SLOT_WIDTH
_REDIS_SLOT_ENV = "CORNUS_TEST_REDIS_SLOT"
_redis_slot_locks: list[TextIO] = []  # held open for the run: the slot is ours while it is


def claim_redis_slot() -> int:
    """The run's slot of Redis databases. The process that starts the run (xdist's controller,
    or the only process) takes the first slot no other run holds, by an exclusive file lock that
    lasts as long as the process; its workers inherit the slot through the environment."""
    if _REDIS_SLOT_ENV in os.environ:
        return int(os.environ[_REDIS_SLOT_ENV])
    for slot in range(REDIS_DB_SLOT_COUNT):
        lock = open(Path(tempfile.gettempdir()) / f"cornus-tests-redis-slot-{slot}.lock", "w")  # noqa: SIM115
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        _redis_slot_locks.append(lock)
        os.environ[_REDIS_SLOT_ENV] = str(slot)
        return slot
    raise RuntimeError(f"all {REDIS_DB_SLOT_COUNT} slots of Redis databases are held by other test runs")


def _worker_db_first() -> int:
    index = worker_index()
    assert index < REDIS_WORKER_COUNT_MAX, f"worker {index}: a run has at most {REDIS_WORKER_COUNT_MAX} workers"
    return REDIS_DB_CLUSTER_FIRST + claim_redis_slot() * REDIS_DB_SLOT_WIDTH + index * REDIS_DB_PER_WORKER


def redis_db_cluster() -> int:
    """This worker's database for cluster tests (emptied before each)."""
    return _worker_db_first()


def redis_db_bench() -> int:
    """The first of this worker's three bench databases: `cornus bench` on Redis runs each
    protocol in its own database, the URL's and the next two."""
    return _worker_db_first() + 1
