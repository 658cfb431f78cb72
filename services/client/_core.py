"""The I/O-free half of the client SDK, shared by the sync and the async client: configuration,
URL and input checks, node rotation, backoff, and the mapping of HTTP responses and transport
errors to outcomes and typed errors. Both clients only add the HTTP calls and the sleeping, so the
two cannot drift apart in what a response means.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import itertools
import logging
import random
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from services.client.types import (
    InvalidRequest,
    NotFound,
    Op,
    OpKind,
    Outcome,
    ServerError,
    Status,
    TransactionAborted,
    Unavailable,
    ValueNotText,
    WrongState,
)

log = logging.getLogger("cornus.client")

# A client spread over more nodes than this is a configuration mistake, not a cluster.
URL_COUNT_MAX = 256
# Bounds on the knobs themselves, so a typo cannot make a call wait for hours.
TIMEOUT_MS_MAX = 600_000
RETRY_COUNT_LIMIT = 100
# A one-shot that writes runs under an id this client chose (see `client_txn`), so that it can ask
# the status call about it even if the answer is lost. The node refuses a begin ahead of its clock
# or more than 1 s behind it (cornus/protocol/txn_ids.py, whose form `client_txn` copies: the SDK
# stands alone), so the id is dated this much early: a client clock up to that far ahead of the
# node's is still accepted, at the cost of as much of the owners' 2 s for the request.
CLIENT_BEGIN_MS_BACKDATE = 100
CLIENT_TOKEN_BYTES = 16  # 32 hex characters, the most the node accepts
# The tag a client id ends with, by protocol name (txn_ids.PROTOCOL_TAGS).
PROTOCOL_TAGS = {"cornus": "cornus", "2pc": "2pc", "coordinator-log": "clog"}
# The errors with which a node refuses a client-chosen id before anything ran (services/api/rest.py).
CLIENT_TXN_REFUSALS = frozenset({"invalid_txn", "txn_begin_refused"})
# note_refusal's answers.
RERUN = "rerun"
IN_DOUBT = "in_doubt"
# A node's clock read further than this from this client's is no clock's (an hour): ids are then
# dated by this client's own.
CLOCK_OFFSET_MS_MAX = 3_600_000


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Every limit of the SDK. Milliseconds unless the name says otherwise."""

    # Deadline of every HTTP call. It must exceed the node's own commit deadline (10 s), or the
    # client would give up on commits the node is about to answer and report them unknown.
    timeout_ms_request: int = 15_000
    # Deadline of opening a connection; past it the node counts as unreachable and a new
    # transaction fails over to the next node.
    timeout_ms_connect: int = 2_000
    # Retries after the first attempt of a retryable outcome (aborted+retryable, unavailable).
    retry_count_max: int = 4
    # Retry n waits about backoff_ms_min * 2**n, capped at backoff_ms_max, with jitter so that
    # clients that collided on a lock do not collide again in lockstep.
    backoff_ms_min: int = 20
    backoff_ms_max: int = 1_000

    def __post_init__(self) -> None:
        for name in ("timeout_ms_request", "timeout_ms_connect", "backoff_ms_min", "backoff_ms_max"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= TIMEOUT_MS_MAX:
                raise ValueError(f"{name} must be an integer in 1..{TIMEOUT_MS_MAX}, got {value!r}")
        if not isinstance(self.retry_count_max, int) or not 0 <= self.retry_count_max <= RETRY_COUNT_LIMIT:
            raise ValueError(f"retry_count_max must be an integer in 0..{RETRY_COUNT_LIMIT}")
        if self.backoff_ms_min > self.backoff_ms_max:
            raise ValueError("backoff_ms_min must not exceed backoff_ms_max")

    @property
    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.timeout_ms_request / 1000, connect=self.timeout_ms_connect / 1000)


def call_deadline_passed(config: ClientConfig) -> str:
    """What a call that outran its deadline says: its answer may still be on the way, so it is
    taken as lost (a ReadTimeout), never as "not sent"."""
    return f"no whole answer within the call's deadline of {config.timeout_ms_request} ms"


def backoff_s(config: ClientConfig, retry_index: int, rng: random.Random) -> float:
    """How long to wait before retry `retry_index` (0-based): half fixed, half jitter."""
    assert retry_index >= 0
    cap_ms = min(config.backoff_ms_max, config.backoff_ms_min * 2 ** min(retry_index, 30))
    delay_ms = cap_ms / 2 + rng.uniform(0, cap_ms / 2)
    assert 0 < delay_ms <= config.backoff_ms_max
    return delay_ms / 1000


def normalize_url(url: object) -> str:
    """A node's base URL without a trailing slash; InvalidRequest if it is not an http(s) URL."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidRequest(0, "bad_url", f"a node URL must be a non-empty string, got {url!r}")
    try:
        parsed = httpx.URL(url.strip())
    except (httpx.InvalidURL, TypeError, ValueError) as error:
        raise InvalidRequest(0, "bad_url", f"{url!r} is not a URL: {error}") from error
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise InvalidRequest(0, "bad_url", f"{url!r} must look like http://HOST:PORT")
    if parsed.query or parsed.fragment:
        raise InvalidRequest(0, "bad_url", f"{url!r}: a node URL takes no query or fragment")
    return str(parsed).rstrip("/")


def normalize_urls(urls: str | Iterable[str]) -> tuple[str, ...]:
    items = [urls] if isinstance(urls, str) else list(urls)
    if not 0 < len(items) <= URL_COUNT_MAX:
        raise InvalidRequest(0, "bad_url", f"give 1..{URL_COUNT_MAX} node URLs, got {len(items)}")
    return tuple(dict.fromkeys(normalize_url(url) for url in items))


class NodeRotation:
    """Round-robin over the nodes, one start per new transaction, so load spreads and a dead node
    costs each transaction at most one failed connect."""

    def __init__(self, urls: tuple[str, ...]) -> None:
        assert urls
        self.urls = urls
        # next() on itertools.count is atomic under the GIL, so threads sharing a client rotate safely.
        self._counter = itertools.count()

    def order(self) -> list[str]:
        start = next(self._counter) % len(self.urls)
        return [*self.urls[start:], *self.urls[:start]]


def check_key(key: object) -> str:
    # Only the Python types are checked here: lengths and emptiness are the server's limits (they
    # are configurable there), and it reports them with the same typed error.
    if not isinstance(key, str):
        raise InvalidRequest(0, "invalid_request", f"a key must be a str, got {type(key).__name__}")
    return key


def check_value(key: str, value: object, *, nullable: bool) -> str | None:
    if value is None and nullable:
        return None
    if not isinstance(value, str):
        # Said for bytes: the REST API takes text values alone, and a caller holding the bytes of a
        # binary read may try to write them back.
        binary = (" (the REST API carries text values only, stored as UTF-8: write other bytes through "
                  "the gRPC API)") if isinstance(value, bytes | bytearray | memoryview) else ""
        raise InvalidRequest(0, "invalid_request",
                             f"the value of {key!r} must be a str, got {type(value).__name__}{binary}")
    return value


def check_ops(ops: Iterable[Op]) -> list[Op]:
    checked = list(ops)
    for op in checked:
        if not isinstance(op, Op) or not isinstance(op.kind, OpKind):
            raise InvalidRequest(0, "invalid_request", f"not an operation: {op!r} (build one with Op.put etc.)")
        check_key(op.key)
        check_value(op.key, op.value, nullable=op.kind is not OpKind.PUT)
    return checked


def check_keys(keys: str | Sequence[str]) -> list[str]:
    # A bare str is a Sequence too; read("ab") means the key "ab", not the keys "a" and "b".
    items = [keys] if isinstance(keys, str) else list(keys)
    return [check_key(key) for key in items]


def check_writes(writes: Mapping[str, str | None]) -> dict[str, str | None]:
    if not isinstance(writes, Mapping):
        raise InvalidRequest(0, "invalid_request",
                             f"writes must be a mapping key -> value, got {type(writes).__name__}")
    return {check_key(key): check_value(key, value, nullable=True) for key, value in writes.items()}


def check_txn(txn: object) -> str:
    if not isinstance(txn, str) or not txn:
        raise InvalidRequest(0, "invalid_request", f"a transaction id must be a non-empty str, got {txn!r}")
    return txn


def txn_path(txn: str, suffix: str = "") -> str:
    # Quoted although the server's ids are URL-safe: a mistyped id must reach the server as
    # typed and come back as a 4xx, not be reinterpreted as another path.
    return f"/v1/txn/{quote(check_txn(txn), safe='')}{suffix}"


def execute_body(ops: Sequence[Op], protocol: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"ops": [op.to_json() for op in ops]}
    if protocol is not None:
        body["protocol"] = protocol
    return body


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """What GET /healthz says of the node behind a URL: its id, its default protocol, and how far
    its clock runs ahead of this client's (ms; 0 where the node does not say), by which client ids
    are dated, so that the node refuses none of them for this client's clock."""

    node: str
    protocol: str
    clock_offset_ms: int = 0
    # How far behind its clock the node takes an id's begin (None: it does not say): ids are dated
    # early by a quarter of it at most (found by audit: with a short peer request timeout, ids
    # dated a fixed 100 ms early were refused as too old, and every write ended UNKNOWN).
    age_ms_max: int | None = None


def identity_from(
    response: httpx.Response, asked_s: float | None = None, answered_s: float | None = None,
) -> tuple[bool, NodeIdentity | None]:
    """(whether to keep the answer for this URL, the identity it gives). A node's 200 without the
    two fields is an older node's, kept as None (no client ids there); anything else (a proxy's
    page, a 5xx) is not kept, and this call goes without a client id. `asked_s` and `answered_s`:
    this client's time.time() around the request, against which the node's clock is read."""
    if response.status_code != 200:
        return False, None
    try:
        body = response.json()
    except ValueError:
        return False, None
    if not isinstance(body, dict) or body.get("status") != "ok":
        return False, None
    node, protocol = body.get("node"), body.get("protocol")
    if not isinstance(node, str) or not node or protocol not in PROTOCOL_TAGS:
        return True, None
    offset_ms = 0
    node_ms = body.get("now_unix_ms")
    if (isinstance(node_ms, int) and not isinstance(node_ms, bool) and asked_s is not None
            and answered_s is not None):
        # The node read its clock between the two: off by at most half the round trip.
        offset_ms = node_ms - round((asked_s + answered_s) / 2 * 1000)
        if abs(offset_ms) > CLOCK_OFFSET_MS_MAX:
            offset_ms = 0  # no clock is that far off: a proxy's or a bug's answer, not the node's
    age_ms_max = body.get("client_txn_age_ms_max")
    if not isinstance(age_ms_max, int) or isinstance(age_ms_max, bool) or age_ms_max <= 0:
        age_ms_max = None
    return True, NodeIdentity(node, protocol, offset_ms, age_ms_max)


def begin_backdate_ms(identity: NodeIdentity) -> int:
    """How early an id for the node `identity` names is dated: CLIENT_BEGIN_MS_BACKDATE, and at
    most a quarter of the age the node takes."""
    if identity.age_ms_max is None:
        return CLIENT_BEGIN_MS_BACKDATE
    return min(CLIENT_BEGIN_MS_BACKDATE, identity.age_ms_max // 4)


def client_txn(identity: NodeIdentity, protocol: str | None) -> str:
    """A new id for a one-shot sent to the node `identity` names: `<begin ms>.<node>.c<token>.1.<tag>`,
    the token from a CSPRNG. "" for a protocol this client does not know (the node names the
    problem, as without an id)."""
    tag = PROTOCOL_TAGS.get(protocol or identity.protocol)
    if tag is None:
        return ""
    begin_ms = int(time.time() * 1000) + identity.clock_offset_ms - begin_backdate_ms(identity)
    return f"{begin_ms}.{identity.node}.c{secrets.token_hex(CLIENT_TOKEN_BYTES)}.1.{tag}"


def client_txn_refusal(response: httpx.Response) -> str:
    """The error code of a node's refusal of a client-chosen id ("" if `response` is none): the
    node ran nothing, so the same transaction may go again under a server-chosen id."""
    if response.status_code != 400:
        return ""
    try:
        body = response.json()
    except ValueError:
        return ""
    error = body.get("error") if isinstance(body, dict) else None
    return error if error in CLIENT_TXN_REFUSALS else ""


def note_refusal(
    identities: dict[str, NodeIdentity | None], logged: set[tuple[str, str]], url: str, response: httpx.Response,
) -> str:
    """How the node at `url` refused the client-chosen id: "" (it did not), RERUN (this request
    ran nothing, nor did any other of it: go again without an id) or IN_DOUBT (this one ran
    nothing, but an earlier delivery of the same request, by a proxy that sends a POST again, may
    have run it: a begin too old, or before the node's process started, is how a second delivery
    after a commit and a restart looks; found by audit: rerun, it committed twice; and an id that
    names another node). A begin ahead of the node's clock was ahead at any earlier delivery too.
    Its identity is forgotten, to be asked again next time (the URL may lead to another node now,
    its clock may have moved), or, when the URL leads to several nodes, no longer asked; and the
    first refusal of each kind is logged: every later call would pay the same extra request."""
    refusal = client_txn_refusal(response)
    if not refusal:
        return ""
    begun_before = refusal == "txn_begin_refused" and "ahead of this node's clock" not in response.text
    # An id naming another node than the one that refused it: `url` leads to several nodes (a load
    # balancer), and the proxy may have delivered the same request to the node it names first
    # (found by audit: rerun, it committed twice). Every other form the id was refused for, every
    # node refuses alike.
    named_another = refusal == "invalid_txn" and _NAMES_ANOTHER_NODE in response.text
    kind = IN_DOUBT if begun_before or named_another else RERUN
    _learn_of_url(identities, url, named_another=named_another)
    if (refusal, kind) not in logged:
        logged.add((refusal, kind))
        then = ("its outcome is unknown: ask its status" if kind == IN_DOUBT else
                "this call, and any other it refuses, runs under an id the node chooses, which a lost answer "
                "leaves unknown")
        log.warning("%s refused a client-chosen transaction id (%s: %s); %s", url, refusal, response.text[:300], then)
    return kind


def note_id_in_doubt(identities: dict[str, NodeIdentity | None], url: str, outcome: Outcome) -> None:
    """A node answered a one-shot under this client's id UNKNOWN because an earlier delivery may
    have run it (a node of this version answers so where an older one refused the id, `note_refusal`):
    learn what the refusal says of `url` (found by review: a URL in front of several nodes kept
    getting ids naming one of them, and every write routed to another ended UNKNOWN)."""
    if outcome.status is not Status.UNKNOWN:
        return
    if _NAMES_ANOTHER_NODE in outcome.detail or any(words in outcome.detail for words in _BEGUN_TOO_EARLY):
        _learn_of_url(identities, url, named_another=_NAMES_ANOTHER_NODE in outcome.detail)


# How a node words the refusals of an id that tell something of the URL it was sent to
# (cornus/protocol/txn_ids.py; the SDK stands alone, so it reads the words).
_NAMES_ANOTHER_NODE = "must name the node it is sent to"
_BEGUN_TOO_EARLY = ("behind this node's clock", "not after this node's coordinator started")


def _learn_of_url(identities: dict[str, NodeIdentity | None], url: str, *, named_another: bool) -> None:
    """After a refusal of this client's id at `url`: no more ids for a URL that leads to several
    nodes (its calls go under ids the nodes choose); else ask its identity again next time (the URL
    may lead to another node now, or its clock, or the process behind it, moved)."""
    if named_another:
        identities[url] = None
    else:
        identities.pop(url, None)


def is_unsent(error: httpx.TransportError) -> bool:
    """True when the request surely never reached the node, so another node may run it instead.
    Any other transport error may have hit after the node acted on the request."""
    return isinstance(error, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)


def unreachable(url: str, txn: str, why: str) -> Outcome:
    """Nothing was committed and nothing will be: retrying (as a new transaction) is safe.
    `url` is "" when no node answered at all (`why` then names them)."""
    return Outcome(txn, Status.UNAVAILABLE, retryable=True, detail=f"{url}: {why}" if url else why, node_url=url)


def refused_in_doubt(url: str, txn: str, response: httpx.Response) -> Outcome:
    """The node refused the client's id in a way an earlier delivery of the request may have run
    it (note_refusal's IN_DOUBT): the status call tells."""
    return Outcome(txn, Status.UNKNOWN, node_url=url,
                   detail=f"{url} refused the transaction's id ({response.text[:200]}); an earlier delivery of "
                          "the same request may have run it: ask its status")


def unknown(url: str, txn: str, error: Exception) -> Outcome:
    return Outcome(txn, Status.UNKNOWN, node_url=url,
                   detail=f"{url}: no answer after the request was sent ({describe(error)}); it may have committed")


def describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _json(url: str, response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError as error:
        raise ServerError(response.status_code, "bad_response",
                          f"{url}: body is not JSON: {response.text[:200]!r}") from error


def _raise_for_error(url: str, response: httpx.Response, body: Any) -> None:
    """Raise the typed error of a 4xx or of a 503 without an outcome."""
    code = response.status_code
    error = str(body.get("error", "")) if isinstance(body, dict) else ""
    detail = str(body.get("detail", "")) if isinstance(body, dict) else repr(body)[:200]
    if code in (400, 413, 422):
        raise InvalidRequest(code, error or "invalid_request", detail)
    if code == 404:
        raise NotFound(code, error or "not_found", detail)
    if code == 409:
        raise WrongState(code, error or "wrong_state", detail)
    if code == 503:
        raise Unavailable(unreachable(url, "", f"{error or 'unavailable'}: {detail}"))
    if 400 <= code < 500:
        raise InvalidRequest(code, error or "client_error", detail)


def _values_from(body: dict[str, Any], text_field: str) -> tuple[dict[str, str | None], dict[str, bytes]]:
    """The values of a node's answer: `text_field` (key -> text or None) and `<text_field>_base64`
    (key -> base64 of a value that is not UTF-8, the exact bytes). TypeError, ValueError or
    AttributeError for an answer of another shape, or a key in both (which is the value?)."""
    text = body.get(text_field) or {}
    encoded = body.get(f"{text_field}_base64") or {}
    values = {str(key): None if value is None else str(value) for key, value in text.items()}
    binary = {str(key): _exact_bytes(value) for key, value in encoded.items()}
    if values.keys() & binary.keys():
        raise ValueError(f"keys both in {text_field} and {text_field}_base64")
    return values, binary


def _exact_bytes(encoded: object) -> bytes:
    if not isinstance(encoded, str):
        raise TypeError(f"a base64 value must be a string, got {type(encoded).__name__}")
    try:
        return base64.b64decode(encoded, validate=True)
    except binascii.Error as error:  # a ValueError; said apart for the message
        raise ValueError(f"not base64: {error}") from error


def _outcome_from(url: str, body: dict[str, Any]) -> Outcome:
    try:
        status = Status(body["outcome"])
        reason = body.get("reason")
        reads, binary_reads = _values_from(body, "reads")
        timing = body.get("timing_ms") or {}
        return Outcome(
            txn=str(body.get("txn", "")),
            status=status,
            reason=None if reason is None else str(reason),
            retryable=bool(body.get("retryable", False)),
            detail=str(body.get("detail", "")),
            reads=reads,
            binary_reads=binary_reads,
            timing_ms={str(key): float(value) for key, value in timing.items()},
            node_url=url,
        )
    except (KeyError, TypeError, ValueError, AttributeError, AssertionError) as error:
        raise ServerError(200, "bad_response", f"{url}: not an outcome: {body!r}"[:400]) from error


def _read_values(url: str, body: Any, names: list[str]) -> tuple[dict[str, str | None], dict[str, bytes]]:
    """An interactive read's answer of `names`: (text values, exact bytes of the others), each
    name in one of the two. ServerError for an answer of another shape."""
    try:
        if not isinstance(body, dict) or not isinstance(body.get("values"), dict):
            raise TypeError("no values")
        text, binary = _values_from(body, "values")
    except (TypeError, ValueError, AttributeError) as error:
        raise ServerError(200, "bad_response", f"{url}: read returned {body!r}"[:400]) from error
    if not set(names) <= text.keys() | binary.keys():
        raise ServerError(200, "bad_response", f"{url}: read returned {body!r}"[:400])
    return text, binary


def read_text(url: str, body: Any, names: list[str]) -> dict[str, str | None]:
    """What Transaction.read returns: name -> text (None: absent). ValueNotText for a value that
    is not UTF-8, whose bytes read_bytes returns: never other bytes in their place."""
    text, binary = _read_values(url, body, names)
    for name in names:
        if name in binary:
            raise ValueNotText(name, binary[name], "txn.read_bytes(keys)")
    return {name: text[name] for name in names}


def read_bytes(url: str, body: Any, names: list[str]) -> dict[str, bytes | None]:
    """What Transaction.read_bytes returns: name -> the value's exact bytes, text or not (None:
    absent)."""
    text, binary = _read_values(url, body, names)
    return {name: binary[name] if name in binary else _utf8(text[name]) for name in names}


def _utf8(value: str | None) -> bytes | None:
    return None if value is None else value.encode("utf-8")


def got_text(outcome: Outcome, key: str) -> str | None:
    """What the client's get returns of a committed one-shot get of `key`: its text (None:
    absent). ValueNotText for a value that is not UTF-8, whose bytes get_bytes returns."""
    if key in outcome.binary_reads:
        raise ValueNotText(key, outcome.binary_reads[key], "client.get_bytes(key)")
    return outcome.reads.get(key)


def parse_outcome(url: str, response: httpx.Response, txn: str, *, may_have_committed: bool,
                  own_id: bool = False, commit: bool = False) -> Outcome:
    """The outcome of execute, commit, abort, status or resolve. Raises the typed error of a 4xx.
    A response outside the API (e.g. a 500) is UNKNOWN where the call could have committed,
    since the node may have failed after committing; elsewhere it is a ServerError. `own_id`: the
    call ran under `txn`, an id this client chose for it, so a node that already knows that id
    (409) ran an earlier delivery of this very request: UNKNOWN, never "refused". `commit`: the
    call commits `txn`, so a node's 409 ("not active") or 404 with no outcome may answer a second
    delivery of it, by a proxy that sent the POST again, while the first commits or after it
    committed and the node restarted: UNKNOWN too (found by audit: raised as "nothing changed")."""
    try:
        body = _json(url, response) if response.content else None
    except ServerError:
        if not may_have_committed:
            raise
        # Not the API's JSON, so not a node's own answer: a proxy's page, or the server's plain
        # 500 when shutdown cut the request. The request may have reached a node that committed.
        body = response.text[:200]
    if isinstance(body, dict) and "outcome" in body:
        return _outcome_from(url, body)
    if response.status_code == 503:
        if may_have_committed and (own_id or commit) and is_busy(response):
            return Outcome(txn, Status.UNKNOWN, node_url=url,
                           detail=f"{url}: the node was too busy to read the request ({_error_text(body)}); an "
                                  f"earlier delivery of it (a proxy's) may have run it: ask its status")
        if may_have_committed and not _node_refusal(body):
            # Not a node's 503 (a node sends one only before any work, with its error code): a
            # proxy's, whose request may have reached a node that committed it.
            return Outcome(txn, Status.UNKNOWN, node_url=url,
                           detail=f"{url}: 503 not from a Cornus node ({_error_text(body)}); it may have committed")
        return unreachable(url, txn, _error_text(body))
    if commit and response.status_code in (404, 409):
        return Outcome(txn, Status.UNKNOWN, node_url=url,
                       detail=f"{url}: the node answered the commit of {txn} with {response.status_code} "
                              f"({_error_text(body)}), as it answers a second delivery of it; ask its status")
    if own_id and response.status_code == 409:
        # Found by audit: raised as WrongState ("nothing changed"), so a caller whose POST a proxy
        # delivered twice, the first answer lost, ran the transaction again.
        return Outcome(txn, Status.UNKNOWN, node_url=url,
                       detail=f"{url}: the node already knows {txn}, the id chosen for this request: an earlier "
                              f"delivery of it ran ({_error_text(body)}); ask its status")
    _raise_for_error(url, response, body)
    if may_have_committed:
        return Outcome(txn, Status.UNKNOWN, node_url=url,
                       detail=f"{url}: unexpected {response.status_code}: {_error_text(body)}; it may have committed")
    raise ServerError(response.status_code, "bad_response", f"{url}: {_error_text(body)}")


# The error codes a node answers 503 with (services/api/rest.py): it refused before doing any work.
# "busy" is its front door's (services/api/http_limits.py), which answers before reading the
# request: nothing of this delivery ran, but it cannot tell an earlier delivery's id.
_NODE_503_ERRORS = frozenset({"unavailable", "storage_unavailable", "busy"})
# Times an execute under its own id is sent again, as it was, to a node too busy to read it: its
# id checks tell a second delivery, and past them the outcome is UNKNOWN, never a new id's run.
BUSY_RESEND_COUNT_MAX = 3


def is_busy(response: httpx.Response) -> bool:
    """Whether `response` is a node's front door's refusal before it read the request."""
    if response.status_code != 503:
        return False
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("error") == "busy"


def status_answered(response: httpx.Response) -> bool:
    """Whether a status call's `response` is an answer about the transaction: not a 503 (a node
    that cannot answer now, or a proxy's page), and a 404 only as a node words it (the API's
    error body, "not_found" with its detail). Found by audit: a gateway's own JSON 404 (no route
    matched) read as "no node knows it: it never committed"."""
    if response.status_code == 503:
        return False
    if response.status_code != 404:
        return True
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("error") == "not_found" and "detail" in body


def _node_refusal(body: Any) -> bool:
    return isinstance(body, dict) and body.get("error") in _NODE_503_ERRORS


def _error_text(body: Any) -> str:
    if isinstance(body, dict) and "error" in body:
        return f"{body['error']}: {body.get('detail', '')}"
    return repr(body)[:200]


def parse_ok(url: str, response: httpx.Response, expected_status: int, txn: str = "") -> Any:
    """The JSON body of begin, read, write or an admin listing. A transaction that the call ended
    (409 with an outcome) raises TransactionAborted; 503 raises Unavailable; 4xx the typed error.
    On a transaction (`txn`), a 503 that is no node's refusal raises ServerError: a proxy's,
    whose request may have reached a node that buffered the write."""
    body = _json(url, response) if response.content else None
    if response.status_code == expected_status:
        return body
    if isinstance(body, dict) and "outcome" in body:
        outcome = _outcome_from(url, body)
        if outcome.status is Status.ABORTED:
            raise TransactionAborted(outcome)
        if outcome.status is Status.UNAVAILABLE:
            raise Unavailable(outcome)
    if txn and response.status_code == 503 and not _node_refusal(body):
        # Found by review: taken for "unavailable" (nothing happened), a write a proxy's 503
        # answered was committed by the transaction's commit; now its caller may only abort.
        raise ServerError(503, "unavailable_not_from_a_node",
                          f"{url}: 503 not from a Cornus node ({_error_text(body)}); the call may have reached one")
    _raise_for_error(url, response, body)
    raise ServerError(response.status_code, "bad_response", f"{url}: {_error_text(body)}")


def with_attempts(outcome: Outcome, attempt_count: int) -> Outcome:
    return dataclasses.replace(outcome, attempt_count=attempt_count)


def is_read_only(ops: Sequence[Op]) -> bool:
    return all(op.kind in (OpKind.GET, OpKind.CHECK) for op in ops)
