"""The REST API's listen address as `cornus serve` binds it (services/serve.py)."""

from __future__ import annotations

import pytest

from services.serve import api_host_port


@pytest.mark.parametrize(("address", "expected"), [
    ("127.0.0.1:8100", ("127.0.0.1", 8100)),
    ("localhost:8100", ("localhost", 8100)),
    # Found by audit (2026-11-27): uvicorn was given "[::1]", which does not resolve, and the node
    # failed to serve after it had taken its identity and partitions.
    ("[::1]:8100", ("::1", 8100)),
])
def test_the_api_binds_the_host_and_port_of_its_address(address: str, expected: tuple[str, int]) -> None:
    assert api_host_port(address) == expected
