"""Who may call a node's admin endpoints (`/v1/admin/*`): the transaction listing, which names
every transaction in flight, and the resolve by hand, whose `force=true` aborts a transaction
another client is running; and the partition listing (`/v1/partitions`), which names the peers'
addresses (found by audit, 2026-11-28). With `admin_token` set (cornus.runtime.config), a call
must carry it as a bearer token (`Authorization: Bearer <token>`); without one they are open to
every client of the API, as the rest of it is (the chart sets one). The other endpoints never
ask for it: health and readiness are the probes', `/metrics` Prometheus's, and transactions the
clients'.
"""

from __future__ import annotations

import hmac

from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

# The security scheme the admin routes declare (OpenAPI shows it); it never answers by itself
# (auto_error off): AdminUnauthorized does, in the API's error shape.
BEARER = HTTPBearer(
    auto_error=False, scheme_name="adminToken",
    description="The node's admin_token (CORNUS_ADMIN_TOKEN), when it has one",
)
# What a refused call is told to send; RFC 6750 asks a 401 to name the scheme.
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="cornus-admin"'}


class AdminUnauthorized(Exception):
    """An admin call without the node's admin token (REST 401)."""


def check_admin(token: str, credentials: HTTPAuthorizationCredentials | None) -> None:
    """Raise AdminUnauthorized unless `credentials` carry `token` ("" admits every call). The
    comparison takes the same time wherever the tokens differ: no guessing it byte by byte."""
    if not token:
        return
    if credentials is None:
        raise AdminUnauthorized("the admin endpoints and the partition listing need the node's admin token: "
                                "Authorization: Bearer <token> (the cornus CLI sends CORNUS_ADMIN_TOKEN)")
    if not hmac.compare_digest(credentials.credentials.encode(), token.encode()):
        raise AdminUnauthorized("the admin token does not match this node's")
