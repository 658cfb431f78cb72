"""The test harness's own sharing rules (tests/worker.py): two runs on one machine never take the
same Redis databases."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO
from tests.worker import REDIS_DB_SLOT_COUNT, claim_redis_slot

SUBPROCESS_TIMEOUT_S = 30


def test_a_second_run_takes_another_slot_of_redis_databases():
    mine = claim_redis_slot()  # this run's, held by its first process for the whole run
    env = {name: value for name, value in os.environ.items() if name != "CORNUS_TEST_REDIS_SLOT"}
    other = subprocess.run(
        [sys.executable, "-c", "from tests.worker import claim_redis_slot; print(claim_redis_slot())"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, check=True,
    )
    theirs = int(other.stdout)
    assert theirs != mine and 0 <= theirs < REDIS_DB_SLOT_COUNT, (mine, theirs)
