"""Which rows of a node's transaction listing `cornus inspect` marks in doubt (services/client/types.py):
what an operator checks before removing nodes (docs/deploy.md, "Scale down")."""

from __future__ import annotations

import pytest

from services.client.types import TxnInfo


def _row(role: str, phase: str, protocol: str) -> TxnInfo:
    return TxnInfo("http://n0", "1.n0.abcdef.1.x", role, "n0" if role == "coordinator" else "p0", phase, protocol,
                   ("p0",), 0)


@pytest.mark.parametrize(("role", "phase", "protocol", "in_doubt"), [
    ("participant", "voted", "cornus", True),
    ("participant", "executing", "2pc", False),
    # Found by audit (2026-11-27): a blocking protocol's coordinator whose decision is not
    # delivered leaves its participants blocked if its node goes away, and was marked "no".
    ("coordinator", "collecting", "2pc", True),
    ("coordinator", "decided", "coordinator-log", True),
    ("coordinator", "validating", "2pc", True),
    ("coordinator", "active", "2pc", False),  # no participant voted: they time out by themselves
    ("coordinator", "collecting", "cornus", False),  # any participant finishes it
])
def test_rows_in_doubt(role: str, phase: str, protocol: str, in_doubt: bool) -> None:
    assert _row(role, phase, protocol).in_doubt is in_doubt
