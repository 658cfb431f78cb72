"""Transaction ids, and what an id tells: its begin time and the protocol the transaction runs.

An id reads `<begin ms>.<coordinator node>.<incarnation>.<counter>.<protocol tag>`. The protocol
is chosen per transaction at begin and never changes, and the id already travels in every message,
timer and log record of the transaction. So the id names the protocol: a participant that gets a
prepare, and recovery that finds a bare record after a crash, both know which protocol machine
owns the transaction, and no record or message format has to grow a field for it.

A client may choose the id of a one-shot itself, so that it knows what to ask the status call about
even when the answer is lost: `<begin ms>.<node>.c<token>.1.<tag>`, where the token is 16 to 32
lowercase hex characters from a CSPRNG. The "c" and the length keep it apart from a server's
incarnation (6 hex characters), so no client id can be one a node makes itself. The node that
receives it checks it with `client_txn_problem` before anything runs.
"""

from __future__ import annotations

import re

from cornus.protocol.config import Protocol, ProtocolConfig
from storage_adapters.contract import TXN_ID_LENGTH_MAX

PROTOCOL_TAGS: dict[Protocol, str] = {
    Protocol.CORNUS: "cornus",
    Protocol.TWO_PC: "2pc",
    Protocol.COORDINATOR_LOG: "clog",
}
_PROTOCOL_BY_TAG = {tag: protocol for protocol, tag in PROTOCOL_TAGS.items()}
assert len(_PROTOCOL_BY_TAG) == len(Protocol), "every protocol needs its own tag"


def new_txn_id(begin_ms: int, node: str, incarnation: str, counter: int, protocol: Protocol) -> str:
    assert begin_ms > 0 and counter > 0
    assert "." not in incarnation, "the incarnation is one field of the id"
    # Begin time first: WAIT_DIE orders transactions by it across partitions.
    return f"{begin_ms}.{node}.{incarnation}.{counter}.{PROTOCOL_TAGS[protocol]}"


def protocol_of(txn: str) -> Protocol | None:
    """The protocol an id names; None for an id this runtime did not make (the tag is last, so a
    node id holding dots cannot confuse it). There is no fallback to a node's default protocol:
    nodes with different defaults would then run different machines for one transaction. An id
    without a tag is refused wherever it enters."""
    return _PROTOCOL_BY_TAG.get(txn.rsplit(".", 1)[-1])


def coordinator_of(txn: str) -> str:
    """The coordinator node an id names ("" for an id this runtime did not make); a node id may
    hold dots, so it is what lies between the begin time and the last three fields."""
    fields = txn.split(".")
    return ".".join(fields[1:-3]) if len(fields) >= 5 else ""


def begin_ms_of(txn: str) -> int:
    """WAIT_DIE's age order: the begin time an id starts with (0 for an id this runtime did not make)."""
    head = txn.split(".", 1)[0]
    # ASCII only: str.isdigit takes "²" for a digit, which int() refuses (found by audit).
    return int(head) if head.isascii() and head.isdigit() else 0


# What a transaction id a caller names may look like, checked alike by the REST and gRPC APIs (by
# full match: Python's "$" alone also matches before a trailing newline, and such an id reached
# the status call, which said "never known"). A leading letter or digit keeps "." and ".." out: a
# client's URL library would resolve them as path segments and send the request to another route.
# Every id this system makes fits it.
TXN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"
TXN_ID_PATTERN_SAYS = "a letter or digit, then letters, digits and '_.:-'"


# How far behind the receiving node's clock a client-chosen id's begin may be. The status call's
# windows (a request "may still be on its way", a record "is kept") and the owners' deadline for a
# one-shot's requests all count from the begin an id carries (status.py), so it must be close to
# the true begin: a begin in the future would stretch the "kept" window past the decision's
# tombstone (the status call would say "never committed" of a commit whose records are gone), and
# one far in the past would let a request that travelled longer arrive after the status call, by
# the "on its way" window, already said "not known". The node also caps it at its peer request
# timeout (`client_begin_problem`'s caller), which that window starts with.
CLIENT_BEGIN_MS_AGE_MAX = 1_000
CLIENT_TOKEN_CHARS_MIN = 16
CLIENT_TOKEN_CHARS_MAX = 32
# The counter field of every client-chosen id: one id is one transaction.
CLIENT_COUNTER = 1
_CLIENT_TOKEN = re.compile(f"c[0-9a-f]{{{CLIENT_TOKEN_CHARS_MIN},{CLIENT_TOKEN_CHARS_MAX}}}")


def is_client_chosen(txn: str) -> bool:
    """Whether `txn` has the form of a client-chosen id (its token field), whoever sent it."""
    fields = txn.rsplit(".", 3)
    return len(fields) == 4 and _CLIENT_TOKEN.fullmatch(fields[1]) is not None


def client_txn_id(begin_ms: int, node: str, token: str, protocol: Protocol) -> str:
    """A client-chosen id for a one-shot coordinated by `node`; `token` is the hex from a CSPRNG."""
    return f"{begin_ms}.{node}.c{token}.{CLIENT_COUNTER}.{PROTOCOL_TAGS[protocol]}"


def client_txn_format_problem(txn: str, node: str) -> str:
    """What is wrong with the form of a client-chosen id sent to `node` ("" if nothing): it must
    name this node, a protocol tag and a token of the form above, and fit every backend."""
    if not isinstance(txn, str) or not txn:
        return "txn must be a non-empty string"
    if len(txn) > TXN_ID_LENGTH_MAX:
        return f"txn is {len(txn)} characters, the limit is {TXN_ID_LENGTH_MAX}"
    # From the right: a node id may hold dots, the last three fields never do.
    fields = txn.rsplit(".", 3)
    if len(fields) != 4:
        return f"txn {txn!r} is not <begin ms>.<node>.c<token>.{CLIENT_COUNTER}.<protocol tag>"
    head, token, counter, tag = fields
    if tag not in _PROTOCOL_BY_TAG:
        return f"txn {txn!r} ends in {tag!r}, not a protocol tag ({', '.join(sorted(_PROTOCOL_BY_TAG))})"
    if counter != str(CLIENT_COUNTER):
        return f"txn {txn!r}: the counter field of a client-chosen id is {CLIENT_COUNTER}, not {counter!r}"
    if not _CLIENT_TOKEN.fullmatch(token):
        return (f"txn {txn!r}: the token must be 'c' and {CLIENT_TOKEN_CHARS_MIN} to {CLIENT_TOKEN_CHARS_MAX} "
                f"lowercase hex characters, got {token!r}")
    begin, _, named = head.partition(".")
    if not begin.isascii() or not begin.isdigit() or begin.startswith("0"):
        return f"txn {txn!r} does not start with its begin time in Unix milliseconds"
    if named != node:
        return f"txn {txn!r} names node {named!r}: a client-chosen id must name the node it is sent to, {node!r}"
    return ""


def client_begins_after_ms(started_ms: int, identity_taken_ms: int | None, clock_slack_ms: int) -> int:
    """What a client-chosen id's begin must be after, at a coordinator process that started at
    `started_ms` and took its node's identity at `identity_taken_ms` (None: not yet): its start,
    and a clock slack after the take. An earlier process of the node that still runs and aborts
    the same id under a blocking protocol reads the identity record after its decision, and must
    find this take there (TwoPhaseCoordinator._abort)."""
    if identity_taken_ms is None:
        return started_ms
    return max(started_ms, identity_taken_ms + clock_slack_ms)


def predecessor_may_have_run(begin_ms: int, identity_taken_ms: int | None, config: ProtocolConfig) -> bool:
    """Whether an earlier process of this node may have run a client-chosen id that begins at
    `begin_ms`: one that still ran when it received it, before it learned that this process took
    the node's identity at `identity_taken_ms` (None: not yet, so one may be running now). The
    holder renews the identity record every identity_check_ms and learns of the take when a
    renewal is refused, which lands within two storage deadlines of falling due (a renewal owed
    while a read is out leaves when that read answers: ProtocolConfig.identity_vacant_ms), by a
    clock that may differ from ours by the slack. Such a request, refused here as "nothing ran"
    (the node stopping, recovering or full), would be run again by its client under a new id."""
    if identity_taken_ms is None:
        return True
    return begin_ms <= identity_taken_ms + config.identity_learn_ms + config.clock_slack_ms


def identity_fresh_for_client_ids(confirmed_ms: float | None, now_ms: float, config: ProtocolConfig) -> bool:
    """Whether a process may begin a client-chosen id now, `confirmed_ms` being when its latest
    read (or renewal, or take) of the identity record that found it its own left, on `now_ms`'s
    clock: within ProtocolConfig.identity_learn_ms of it. Past that it may have been deposed
    without knowing (cut off from storage alone, it hears no refused renewal), and a later
    process's `predecessor_may_have_run`, which counts on it knowing by then, would tell a resend
    "nothing ran" of an id it runs (found by audit, 2026-11-28, second). An id the process makes
    itself names its incarnation: no other process runs it, and no client sends it twice."""
    return confirmed_ms is not None and now_ms - confirmed_ms <= config.identity_learn_ms


def another_process_may_have_run(begin_ms: int, identity_taken_ms: int | None, may_be_deposed: bool,
                                 config: ProtocolConfig) -> bool:
    """Whether a process of this node other than this one may have run a client-chosen id that
    begins at `begin_ms`: an earlier one (`predecessor_may_have_run`), or, where this one
    `may_be_deposed` (it was, or its identity is not fresh: `identity_fresh_for_client_ids`), a
    later one that took the identity, whatever the begin: it serves the node's requests now, and a
    proxy may have delivered this very request there first (found by audit, 2026-11-28: a deposed
    process refused it as "stopping", nothing ran, and the client ran a transfer its successor had
    committed again under a new id)."""
    return may_be_deposed or predecessor_may_have_run(begin_ms, identity_taken_ms, config)


def client_begin_problem(begin_ms: int, now_ms: int, started_ms: int, age_ms_max: int) -> str:
    """What is wrong with the begin time of a client-chosen id ("" if nothing), by the receiving
    node's clock `now_ms`, given the wall time `started_ms` at which its coordinator process
    started: the begin is not ahead of the node's clock, at most `age_ms_max` old
    (CLIENT_BEGIN_MS_AGE_MAX, see there), and after the process started. That last rule is what
    makes a resend of the same id after a coordinator restart, whose memory of the id is gone, a
    refusal rather than a second run: the first run was received, so began, before the restart.
    The same millisecond is refused too: the clock cannot order the two."""
    if begin_ms > now_ms:
        return (f"its begin time {begin_ms} is {begin_ms - now_ms} ms ahead of this node's clock: "
                "the client's clock runs ahead")
    if now_ms - begin_ms > age_ms_max:
        return (f"its begin time {begin_ms} is {now_ms - begin_ms} ms behind this node's clock, the limit is "
                f"{age_ms_max} ms: the client's clock runs behind, or the request took that long")
    if begin_ms <= started_ms:
        return (f"its begin time {begin_ms} is not after this node's coordinator started ({started_ms}): "
                "a transaction sent to an earlier run of it cannot be run again")
    return ""


def client_txn_problem(txn: str, node: str, now_ms: int, started_ms: int,
                       age_ms_max: int = CLIENT_BEGIN_MS_AGE_MAX) -> str:
    """What is wrong with the client-chosen id `txn` sent to `node` ("" if it may run): its form
    (`client_txn_format_problem`), then its begin time (`client_begin_problem`)."""
    problem = client_txn_format_problem(txn, node)
    if problem:
        return problem
    problem = client_begin_problem(begin_ms_of(txn), now_ms, started_ms, age_ms_max)
    return f"txn {txn!r}: {problem}" if problem else ""
