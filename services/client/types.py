"""What the client SDK hands back: typed outcomes, operations and admin listings, and the typed
errors it raises. Plain dataclasses, no I/O, shared by the sync and the async client.

Values are text (str) in the SDK, as in the REST API it speaks: stored as UTF-8. A value stored
through another API (gRPC) that is not UTF-8 is handed back as its exact bytes, never decoded
lossily: in `Outcome.binary_reads` (its key left out of `Outcome.reads`) and by the calls that
return bytes (`get_bytes`, `read_bytes`); a call that returns text raises ValueNotText for it.

The SDK depends on httpx alone (never on `cornus` or `storage_adapters`), so an application can
install it without the server's gRPC and storage clients.
"""

from __future__ import annotations

import base64
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class Status(enum.StrEnum):
    COMMITTED = "committed"
    ABORTED = "aborted"
    UNAVAILABLE = "unavailable"  # storage or peers did not answer: nothing was committed, retry
    UNKNOWN = "unknown"  # it may have committed: ask `status(txn)` later
    ACTIVE = "active"  # only from `status(txn)`: the transaction is still running


class OpKind(enum.StrEnum):
    GET = "get"
    PUT = "put"
    DELETE = "delete"
    CHECK = "check"


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of a one-shot transaction. `check` aborts the transaction unless the key holds
    `value` (None: unless the key is absent)."""

    kind: OpKind
    key: str
    value: str | None = None

    @classmethod
    def get(cls, key: str) -> Op:
        return cls(OpKind.GET, key)

    @classmethod
    def put(cls, key: str, value: str) -> Op:
        return cls(OpKind.PUT, key, value)

    @classmethod
    def delete(cls, key: str) -> Op:
        return cls(OpKind.DELETE, key)

    @classmethod
    def check(cls, key: str, value: str | None) -> Op:
        return cls(OpKind.CHECK, key, value)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"op": self.kind.value, "key": self.key}
        # The server refuses a value on get/delete and needs one on put; check sends null for
        # "absent", so only get and delete leave it out.
        if self.kind in (OpKind.PUT, OpKind.CHECK):
            body["value"] = self.value
        return body


class TextReads(dict[str, str | None]):
    """`Outcome.reads`: key -> the value read as text (None: the key is absent). A key whose value
    is not UTF-8 is not here but in `Outcome.binary_reads`, and looking it up here ([] or get)
    raises ValueNotText, naming where its bytes are, rather than answering "not read" or "absent"
    (get's default), which a caller could take for the value."""

    def __init__(self, text: Mapping[str, str | None] | None = None,
                 binary: Mapping[str, bytes] | None = None) -> None:
        super().__init__(text or {})
        self.binary: Mapping[str, bytes] = binary if binary is not None else {}

    def __missing__(self, key: str) -> str | None:
        self._refuse_binary(key)
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self._refuse_binary(key)
        return super().get(key, default)

    def _refuse_binary(self, key: str) -> None:
        if key in self.binary:
            raise ValueNotText(key, self.binary[key], "outcome.binary_reads[key] (outcome.read_bytes(key))")


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a transaction ended, as the node that ran it reported (or as the client concluded when
    no answer came: then `status` is UNKNOWN or UNAVAILABLE and `detail` says why)."""

    txn: str
    status: Status
    reason: str | None = None
    retryable: bool = False
    detail: str = ""
    # key -> value read, as text (None: absent); a TextReads, which refuses the keys of binary_reads.
    reads: dict[str, str | None] = field(default_factory=dict)
    timing_ms: dict[str, float] = field(default_factory=dict)
    # The node that answered (base URL), or the one that was asked when none answered.
    node_url: str = ""
    # HTTP requests this outcome took, retries included.
    attempt_count: int = 1
    # key -> the exact bytes of a value read that is not UTF-8 text (stored through gRPC), which
    # the node sends base64-encoded (`reads_base64`); such a key is not in `reads`.
    binary_reads: dict[str, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert isinstance(self.status, Status), self.status
        assert self.attempt_count >= 1, self.attempt_count
        # Only an abort has a reason, and the server never calls a commit or an unknown outcome
        # retryable: retrying either could apply the writes twice.
        assert self.reason is None or self.status is Status.ABORTED, (self.status, self.reason)
        assert not self.retryable or self.status in (Status.ABORTED, Status.UNAVAILABLE), self
        assert not self.reads.keys() & self.binary_reads.keys(), (self.reads, self.binary_reads)
        if not (isinstance(self.reads, TextReads) and self.reads.binary is self.binary_reads):
            object.__setattr__(self, "reads", TextReads(self.reads, self.binary_reads))

    @property
    def committed(self) -> bool:
        return self.status is Status.COMMITTED

    def raise_for_outcome(self) -> Outcome:
        """Return self when committed, else raise the matching TransactionFailed."""
        if self.status is Status.COMMITTED:
            return self
        raise failure_for(self)

    def read_bytes(self, key: str) -> bytes | None:
        """The exact bytes of the value read of `key`, text or not (None: absent). KeyError if
        the transaction did not read `key`."""
        if key in self.binary_reads:
            return self.binary_reads[key]
        value = self.reads[key]
        return None if value is None else value.encode("utf-8")

    def to_json(self) -> dict[str, Any]:
        """As the REST API words an outcome: binary reads base64-encoded under `reads_base64`,
        present only when there are some."""
        body: dict[str, Any] = {
            "txn": self.txn, "outcome": self.status.value, "reason": self.reason, "retryable": self.retryable,
            "detail": self.detail, "reads": dict(self.reads), "timing_ms": dict(self.timing_ms),
            "node_url": self.node_url, "attempt_count": self.attempt_count,
        }
        if self.binary_reads:
            body["reads_base64"] = {key: base64.b64encode(value).decode("ascii")
                                    for key, value in self.binary_reads.items()}
        return body


# Protocols whose participants learn the decision only from their coordinator, and the phases of a
# coordinator's machine (cornus.protocol.coordinator_base.CoordPhase) before every participant
# acknowledged it: the listing shows no coordinator machine once it is delivered.
_BLOCKING_PROTOCOLS = frozenset({"2pc", "coordinator-log"})
_COORDINATOR_PHASES_UNDELIVERED = frozenset({"validating", "collecting", "decided"})


@dataclass(frozen=True, slots=True)
class TxnInfo:
    """One row of a node's admin listing. In doubt (`in_doubt`): a participant in phase "voted"
    (it voted yes and knows no decision yet), and a 2PC or coordinator-log coordinator whose
    commit runs or whose decision is not delivered yet: its participants block until it answers,
    so its node must not be removed before it ends."""

    node_url: str
    txn: str
    role: str
    where: str
    phase: str
    protocol: str
    partitions: tuple[str, ...]
    idle_ms: int

    @property
    def in_doubt(self) -> bool:
        if self.role == "participant":
            return self.phase == "voted"
        # Found by audit (2026-11-27): such coordinators were marked "no", and an operator who
        # checked the nodes going away before a scale-down removed one under blocked participants.
        return self.protocol in _BLOCKING_PROTOCOLS and self.phase in _COORDINATOR_PHASES_UNDELIVERED

    @classmethod
    def from_json(cls, node_url: str, body: Mapping[str, Any]) -> TxnInfo:
        try:
            return cls(node_url, str(body["txn"]), str(body["role"]), str(body["where"]), str(body["phase"]),
                       str(body["protocol"]), tuple(str(p) for p in body["partitions"]), int(body["idle_ms"]))
        except (KeyError, TypeError, ValueError) as error:
            raise ServerError(200, "bad_response", f"{node_url}: not a transaction listing row: {body!r}") from error


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition's ownership, as storage says when the node was asked. `owner` "" is a
    released partition (or one never taken: `epoch` 0); `preferred` is the owner the asked node's
    configuration prefers; `placed` means the preferred node holds it."""

    node_url: str
    partition: str
    owner: str
    epoch: int
    version: int
    lease_ms: int
    wanted_by: str
    preferred: str
    served_here: bool

    @property
    def placed(self) -> bool:
        return self.owner == self.preferred

    @classmethod
    def from_json(cls, node_url: str, body: Mapping[str, Any]) -> PartitionInfo:
        try:
            return cls(node_url, str(body["partition"]), str(body["owner"]), int(body["epoch"]), int(body["version"]),
                       int(body["lease_ms"]), str(body["wanted_by"]), str(body["preferred"]),
                       bool(body["served_here"]))
        except (KeyError, TypeError, ValueError) as error:
            raise ServerError(200, "bad_response", f"{node_url}: not a partition row: {body!r}") from error



@dataclass(frozen=True, slots=True)
class PartitionListing:
    """One node's whole answer about partitions: the node that answered, the node set and the
    explicit preferred owners it runs with (what its rows' `preferred` is computed from), and
    every partition's ownership as storage says now."""

    node_url: str
    node: str
    peers: dict[str, str]
    partition_owners: dict[str, str]
    partitions: tuple[PartitionInfo, ...]

    @classmethod
    def from_json(cls, node_url: str, body: object) -> PartitionListing:
        if not isinstance(body, Mapping) or not isinstance(body.get("partitions"), list):
            raise ServerError(200, "bad_response", f"{node_url}: not a partition listing: {body!r}"[:400])
        node, peers, owners = body.get("node"), body.get("peers"), body.get("partition_owners")
        if not isinstance(node, str) or not isinstance(peers, Mapping) or not isinstance(owners, Mapping):
            raise ServerError(200, "bad_response", f"{node_url}: a partition listing without node, peers and "
                                                   f"partition_owners (a node older than this client?)")
        return cls(node_url, node, {str(k): str(v) for k, v in peers.items()},
                   {str(k): str(v) for k, v in owners.items()},
                   tuple(PartitionInfo.from_json(node_url, row) for row in body["partitions"]))

# === errors =======================================================================================


class CornusError(Exception):
    """Every error the SDK raises."""


class RequestError(CornusError):
    """The server refused the request (4xx); nothing changed."""

    def __init__(self, status_code: int, error: str, detail: str) -> None:
        super().__init__(f"{error} ({status_code}): {detail}")
        self.status_code = status_code
        self.error = error
        self.detail = detail


class InvalidRequest(RequestError):
    """Malformed or out-of-limits input (400, 422, or refused by the client before sending),
    whether the node asked or a partition's owner refused it: nothing changed."""


class NotFound(RequestError):
    """The transaction is unknown to the node asked (404)."""


class WrongState(RequestError):
    """The transaction's state does not allow the call, e.g. a write after it ended (409)."""


class ServerError(CornusError):
    """A response the API does not define (a 5xx other than 503, or a body of the wrong shape)."""

    def __init__(self, status_code: int, error: str, detail: str) -> None:
        super().__init__(f"{error} ({status_code}): {detail}")
        self.status_code = status_code
        self.error = error
        self.detail = detail


class ValueNotText(CornusError):
    """A value read is not UTF-8 text (it was stored through gRPC, which takes any bytes) and the
    call returns text: it raises rather than hand back other bytes. `value` holds the exact bytes;
    the message says where else they are. Nothing changed: the read itself succeeded."""

    def __init__(self, key: str, value: bytes, where: str) -> None:
        super().__init__(f"the value of {key!r} is not UTF-8 text ({len(value)} bytes): its exact bytes are in "
                         f"{where}, and in this error's `value`")
        self.key = key
        self.value = value


class TransactionFailed(CornusError):
    """A transaction did not commit; `outcome` says how it ended."""

    def __init__(self, outcome: Outcome) -> None:
        reason = f" ({outcome.reason})" if outcome.reason else ""
        detail = f": {outcome.detail}" if outcome.detail else ""
        super().__init__(f"transaction {outcome.txn or '(none)'} {outcome.status.value}{reason}{detail}")
        self.outcome = outcome

    @property
    def retryable(self) -> bool:
        return self.outcome.retryable


class TransactionAborted(TransactionFailed):
    """Aborted; nothing was written. `retryable` says whether running it again may succeed."""


class Unavailable(TransactionFailed):
    """No node could run it (unreachable, overloaded, storage down); nothing was committed."""


class OutcomeUnknown(TransactionFailed):
    """It may have committed: never retry blindly, ask `status(outcome.txn)`."""


def failure_for(outcome: Outcome) -> TransactionFailed:
    assert outcome.status is not Status.COMMITTED, outcome
    if outcome.status is Status.ABORTED:
        return TransactionAborted(outcome)
    if outcome.status is Status.UNAVAILABLE:
        return Unavailable(outcome)
    return OutcomeUnknown(outcome)
