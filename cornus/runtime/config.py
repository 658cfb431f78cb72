"""A node's one typed configuration, read from a TOML file, then `CORNUS_*` environment variables,
then command-line flags (each overriding the one before), and checked before anything starts.

    node_id = "n0"
    cluster_id = "cornus"              # which deployment: recorded in storage by its first node
    listen = "127.0.0.1:7100"          # node-to-node transport (TCP)
    api_listen = "127.0.0.1:8100"      # public REST API
    grpc_api_listen = "127.0.0.1:9100" # public gRPC API (optional)
    protocol = "cornus"                # default per transaction: cornus | 2pc | coordinator-log
    lock_policy = "no_wait"            # strict 2PL on a conflict: no_wait (abort, the paper's) | wait_die
    admin_token = "..."                # optional: /v1/admin/* then need "Authorization: Bearer <it>"
    partition_count = 6                # partitions p0..p5, preferred owners round-robin by node id
    [peers]                            # every node, this one included
    n0 = "127.0.0.1:7100"
    n1 = "127.0.0.1:7101"
    [partition_owners]                 # optional preferred owners, override round-robin
    p0 = "n1"
    [storage]                          # storage_adapters.factory.StoreConfig fields
    backend = "redis"
    redis_url = "redis://127.0.0.1:6379/0"
    [timeouts]                         # ProtocolConfig, RuntimeLimits and OwnershipConfig fields
    timeout_ms_prepare = 400
    lease_ms = 4000
    [peer_tls]                         # optional: mutual TLS on `listen` (cornus.runtime.peer_tls)
    cert_file = "/etc/cornus/tls/tls.crt"
    key_file = "/etc/cornus/tls/tls.key"
    ca_file = "/etc/cornus/tls/ca.crt"
    verify_hostname = true             # the peer's certificate must name its peers entry's host

Which node owns a partition is decided at run time, by leases in storage (cornus.protocol.ownership);
the configuration only names each partition's preferred owner, which gets it when it is alive.

Environment: CORNUS_NODE_ID, CORNUS_CLUSTER_ID, CORNUS_LISTEN, CORNUS_API_LISTEN, CORNUS_GRPC_API_LISTEN,
CORNUS_PROTOCOL, CORNUS_LOCK_POLICY, CORNUS_PARTITION_COUNT, CORNUS_ADMIN_TOKEN (no flag: a command line
is visible to every user of the machine), CORNUS_PEERS ("n0=host:port,n1=host:port"),
CORNUS_STORAGE_<FIELD>, CORNUS_PEER_TLS_<FIELD> (e.g. CORNUS_PEER_TLS_CA_FILE), and
CORNUS_<TIMEOUT FIELD> (e.g. CORNUS_TIMEOUT_MS_PREPARE).

One concern, kept in one file past 450 lines on purpose: reading the three sources and the checks
across their fields are one job, since a rule (a grace against the storage deadline, a keep against
the backend's late window, a peer wait against both) spans the sections a split would separate, and
the Helm chart mirrors exactly this file's rules (tests/deploy/test_helm_chart.py). The protocol's
own formulas live in the core (cornus.protocol.config, cornus.protocol.status); here they are only
applied to user input, which gets a ValidationError rather than the core's asserts.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cornus.protocol.cluster_record import CLUSTER_ID_LENGTH_MAX, DEFAULT_CLUSTER_ID
from cornus.protocol.config import (
    OUTCOME_KEEP_MS_FLOOR,
    Protocol,
    ProtocolConfig,
    gc_grace_ms_min,
    outcome_keep_ms_min,
)
from cornus.protocol.locks import Policy
from cornus.protocol.ownership import OwnershipConfig, placement
from cornus.protocol.status import late_vote_ms, late_votes_meet_their_tombstone
from cornus.protocol.sweeper import SweepConfig, sweep_age_ms_min
from cornus.runtime.keys import partition_names
from cornus.runtime.peer_tls import PeerTlsConfig
from storage_adapters.contract import (
    LOG_NAME_LENGTH_MAX,
    NODE_ID_LENGTH_MAX,
    OWNER_LEASE_MS_MAX,
    PARTICIPANT_COUNT_MAX,
    SCAN_PAGE_COUNT_MAX,
    TOMBSTONE_KEEP_MS_MAX,
    validate_id,
)
from storage_adapters.errors import ValidationError
from storage_adapters.factory import AZURE_LEASE_MARGIN_MS, StoreConfig, env_values

PARTITION_COUNT_MAX = 4096
# Deletions of one record retried at most this often: each is a storage call while it is down.
GC_ATTEMPT_COUNT_MAX = 1_000
NODE_COUNT_MAX = 256
# An admin token short enough to guess is no guard; a longer one than any header needs is a mistake.
ADMIN_TOKEN_LENGTH_MIN = 16
ADMIN_TOKEN_LENGTH_MAX = 512
_ADMIN_TOKEN = re.compile(rf"(?=.{{{ADMIN_TOKEN_LENGTH_MIN},{ADMIN_TOKEN_LENGTH_MAX}}}$)[A-Za-z0-9\-._~+/]+=*")
DNS_LABEL_LENGTH_MAX = 63  # RFC 1035
_PARTITION_NAME = re.compile(r"p[0-9]+")  # cornus.runtime.keys.partition_names
_ADDRESS = re.compile(r"^[A-Za-z0-9.\-\[\]:]+:\d{1,5}$")


# The longest deadline a peer request may carry: what the node-to-node transport accepts
# (services/node_rpc TransportLimits.request_timeout_ms_max takes it from here).
TIMEOUT_MS_PEER_REQUEST_MAX = 300_000
# Timers of the protocol and the runtime: an hour at most. Past it a typo (an extra zero or six)
# would hold an abandoned transaction's locks, or a decision, for hours.
TIMER_MS_MAX = 3_600_000
# Every node reads every partition's ownership record each renewal interval: a shorter one is a
# load on storage that no lease needs (found by audit: 1 ms was accepted, a read a millisecond).
RENEW_INTERVAL_MS_MIN = 50


@dataclass(frozen=True, slots=True)
class RuntimeLimits:
    """Deadlines and bounds of the runtime itself (the protocol's own are in ProtocolConfig)."""

    # A peer request (execute, status) that gets no answer in this time fails the operation. A
    # one-shot's requests carry it as their deadline, and the status call says "not known" only
    # once it (plus twice the slack) has passed by its own node's value: the same on every node,
    # so lower it everywhere first and raise it everywhere before relying on the new value.
    timeout_ms_peer_request: int = 2_000
    # A lock request that meets a txn which already voted yes waits this long for its decision
    # (DESIGN 4: Cornus replies before participants release) before it reports a conflict.
    timeout_ms_lock_wait: int = 500
    # Interactive transactions whose client makes no call for this long are aborted by their
    # coordinator; an owner drops an execution no request touched for twice this, and the
    # coordinator of a transaction still at work refreshes those it has not touched for half this.
    timeout_ms_txn_idle: int = 30_000
    # Transactions one node coordinates at once; past it new ones are refused (retryable).
    txn_count_max: int = 10_000
    # Operations in one execute request.
    op_count_max: int = 1_000
    # Operations in one transaction, over all its requests.
    txn_op_count_max: int = 10_000
    # Partitions one transaction touches (written or read): every one is a message of the commit,
    # and the written ones are listed in every vote record, which holds at most
    # PARTICIPANT_COUNT_MAX.
    txn_partition_count_max: int = PARTICIPANT_COUNT_MAX
    # A node told to stop, once it has released its partitions, waits this long at most for the
    # transactions it coordinates to be collected (their grace, then the deletes): no later
    # process knows a Cornus transaction this one coordinated, so what it leaves stays in storage
    # for ever. Above the default gc_grace_ms (12 s); the chart's terminationGracePeriodSeconds
    # counts on the default. 0: no wait (storage thrown away after, as the bench's).
    timeout_ms_stop_collect: int = 15_000
    # How often the holder of each partition, and each node for its own coordinator log, walks
    # that log's finished records and collects those a coordinator killed within its grace, or a
    # transaction finished by termination, left behind for good (cornus.protocol.sweeper,
    # docs/sweeper-design.md), with a fenced tombstone each (jittered by a fifth either way, so
    # that the nodes do not scan in step). 0: nothing sweeps, and such records stay for good. A
    # minute: a pass whose oldest record is younger than the sweep age costs one scan call.
    sweep_interval_ms: int = 60_000
    # How old a finished record must be before a sweeper collects it. 0: the least the other
    # settings allow (sweeper.sweep_age_ms_min: past every write that may still reach the record,
    # and past what the status call counts on); a value set may not be below that.
    sweep_age_ms: int = 0
    # Storage calls (scans, reads of the other participants' records, tombstones) all of a node's
    # sweepers make a second on average, one page at a time (sweeper.SweepBudget); a page's own
    # calls may come at once. 200: a page of 100 two-partition records costs about that (a scan,
    # a read and a tombstone each), so a node sweeps some 100 records a second, 6,000 a minute,
    # the most one log's pass takes six times over; that clears a long outage's leftovers within
    # the hour, and costs storage what some 50 participants' commits a second do (a vote, an
    # apply, a decision and a collection each), not enough to starve the transactions beside it
    # (on DynamoDB, to burn their capacity). A pass with nothing old costs a scan: at a minute's
    # interval a node would need 12,000 logs to fill the budget with those alone.
    sweep_calls_per_s_max: int = 200

    def __post_init__(self) -> None:
        assert set(_LIMIT_MAX) == {item.name for item in dataclasses.fields(self)}, "a limit without a maximum"
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            least = _LIMIT_MIN.get(item.name, 1)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                qualifier = "non-negative" if least == 0 else "positive"
                raise ValidationError(f"{item.name} must be a {qualifier} integer, got {value!r}")
            if value > _LIMIT_MAX[item.name]:
                raise ValidationError(f"{item.name} is {value}, more than its maximum {_LIMIT_MAX[item.name]}")
        if self.txn_partition_count_max > PARTICIPANT_COUNT_MAX:
            raise ValidationError(
                f"txn_partition_count_max is {self.txn_partition_count_max}; a vote record lists at most "
                f"{PARTICIPANT_COUNT_MAX} participants"
            )
        if self.op_count_max > self.txn_op_count_max:
            raise ValidationError("op_count_max (per request) must not exceed txn_op_count_max (per transaction)")


# The largest op_count_max a node takes: the APIs refuse a longer list of operations, keys or
# writes in the schema, before validating any of its items.
OP_COUNT_MAX_MAX = 100_000
_LIMIT_MAX = {
    "timeout_ms_peer_request": TIMEOUT_MS_PEER_REQUEST_MAX,
    "timeout_ms_lock_wait": TIMER_MS_MAX,
    "timeout_ms_txn_idle": TIMER_MS_MAX,
    # Each one is a few kilobytes of memory on its coordinator, at least.
    "txn_count_max": 1_000_000,
    # What one request or transaction may carry is bounded anyway by the REST body limit and the
    # redo record's size; these stop a setting from promising more than that.
    "op_count_max": OP_COUNT_MAX_MAX,
    "txn_op_count_max": 1_000_000,
    "txn_partition_count_max": PARTICIPANT_COUNT_MAX,
    # Past a minute a stop outlives any supervisor's patience (the chart's grace period).
    "timeout_ms_stop_collect": 60_000,
    "sweep_interval_ms": TIMER_MS_MAX,
    # Records are compared with it, not a timer: as long as a tombstone may be kept.
    "sweep_age_ms": TOMBSTONE_KEEP_MS_MAX,
    # Past it the bound bounds nothing: more than any backend serves one node, and a page of one
    # call is paid in a millisecond already (the budget's timers count whole ones).
    "sweep_calls_per_s_max": 100_000,
}
# Limits that may be 0 (every other is at least 1).
_LIMIT_MIN = {"timeout_ms_stop_collect": 0, "sweep_interval_ms": 0, "sweep_age_ms": 0}


@dataclass(frozen=True, slots=True)
class NodeConfig:
    node_id: str
    peers: dict[str, str]
    # Which deployment this node belongs to: with partition_count, what the storage's cluster
    # record must say (cornus.protocol.cluster_record), so that a second deployment pointed at the
    # same storage (a release of the same name in another namespace) refuses it.
    cluster_id: str = DEFAULT_CLUSTER_ID
    listen: str = ""
    api_listen: str = ""
    grpc_api_listen: str = ""
    protocol: Protocol = Protocol.CORNUS
    partition_count: int = 0
    partition_owners: dict[str, str] = field(default_factory=dict)
    storage: StoreConfig = field(default_factory=StoreConfig)
    protocol_config: ProtocolConfig = field(default_factory=ProtocolConfig)
    limits: RuntimeLimits = field(default_factory=RuntimeLimits)
    ownership: OwnershipConfig = field(default_factory=OwnershipConfig)
    # What a lock request that meets a conflicting holder does: abort at once (NO_WAIT, the
    # paper's setting) or, when older than every holder, wait for them (WAIT_DIE).
    lock_policy: Policy = Policy.NO_WAIT
    # Mutual TLS on the peer port (None: plain TCP, for a network only the cluster reaches).
    peer_tls: PeerTlsConfig | None = None
    # What a caller of the admin endpoints (/v1/admin/*: the transaction listing, a forced
    # resolve) must show as its bearer token; "" leaves them open to every client of the API.
    # Kept out of the repr, which logs and tracebacks print.
    admin_token: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        validate_id(self.node_id, "node_id", NODE_ID_LENGTH_MAX)
        validate_id(self.cluster_id, "cluster_id", CLUSTER_ID_LENGTH_MAX)
        check_peers(self.peers)
        if self.node_id not in self.peers:
            raise ValidationError(f"peers must include this node ({self.node_id})")
        if not self.listen:
            object.__setattr__(self, "listen", self.peers[self.node_id])
        _check_address(self.listen, "listen")
        if self.api_listen:
            _check_address(self.api_listen, "api_listen")
        if self.grpc_api_listen:
            _check_address(self.grpc_api_listen, "grpc_api_listen")
        if not isinstance(self.protocol, Protocol):
            raise ValidationError(f"protocol must be one of {', '.join(p.value for p in Protocol)}")
        if not isinstance(self.lock_policy, Policy):
            raise ValidationError(f"lock_policy must be one of {', '.join(p.value for p in Policy)}")
        if self.admin_token and not (isinstance(self.admin_token, str) and _ADMIN_TOKEN.fullmatch(self.admin_token)):
            # The token itself is never said: the error is logged.
            raise ValidationError(
                f"admin_token must be {ADMIN_TOKEN_LENGTH_MIN}..{ADMIN_TOKEN_LENGTH_MAX} characters of A-Z a-z 0-9 "
                "- . _ ~ + / (a bearer token, RFC 6750), optionally ending in ="
            )
        if not isinstance(self.partition_count, int) or not 0 < self.partition_count <= PARTITION_COUNT_MAX:
            raise ValidationError(f"partition_count must be an integer in 1..{PARTITION_COUNT_MAX}")
        if self.protocol_config.storage_deadline_ms != self.storage.timeout_ms_call:
            raise ValidationError(
                f"protocol_config.storage_deadline_ms ({self.protocol_config.storage_deadline_ms}) must equal the "
                f"storage timeout_ms_call ({self.storage.timeout_ms_call}): it is the deadline of every storage call"
            )
        if self.protocol_config.late_write_window_ms != self.storage.late_write_window_ms:
            # Built by hand with the default (0) over DynamoDB or Azure, collection would leave
            # gaps a late vote could fill (found by review).
            raise ValidationError(
                f"protocol_config.late_write_window_ms ({self.protocol_config.late_write_window_ms}) must be "
                f"the {self.storage.backend} backend's ({self.storage.late_write_window_ms}): how late its "
                "requests land"
            )
        _check_late_votes(self.limits, self.protocol_config)
        sweep = self.sweep_config
        age_ms_min = sweep_age_ms_min(self.protocol_config, self.limits.timeout_ms_peer_request)
        if sweep is not None and sweep.age_ms < age_ms_min:
            # NodeCore asserts the same (sweeper.sweep_age_problem): said here in the settings' names.
            raise ValidationError(
                f"sweep_age_ms is {sweep.age_ms}, below {age_ms_min}: a write of a transaction that old may still "
                "land (a coordinator's termination, a late vote, a manual resolve), or the status call still counts "
                "on its records; set it to at least that, or to 0 for the least allowed"
            )
        for partition, owner in self.partition_owners.items():
            validate_id(partition, "partition", LOG_NAME_LENGTH_MAX)
            if partition not in self.partitions:
                raise ValidationError(f"partition_owners names {partition}, not one of p0..p{self.partition_count - 1}")
            if owner not in self.peers:
                raise ValidationError(f"partition_owners gives {partition} to {owner}, which is not a peer")

    @property
    def partitions(self) -> tuple[str, ...]:
        return partition_names(self.partition_count)

    @property
    def sweep_config(self) -> SweepConfig | None:
        """How this node sweeps (None: it does not, sweep_interval_ms 0)."""
        limits = self.limits
        if not limits.sweep_interval_ms:
            return None
        request_ms = limits.timeout_ms_peer_request
        age_ms = limits.sweep_age_ms or sweep_age_ms_min(self.protocol_config, request_ms)
        return SweepConfig(age_ms=age_ms, interval_ms=limits.sweep_interval_ms, timeout_ms_request=request_ms,
                           calls_per_s_max=limits.sweep_calls_per_s_max)

    def preferred_owner(self, partition: str) -> str:
        """The node that should hold `partition` while it is alive (who holds it is in storage)."""
        return self.placement()[partition]

    def placement(self) -> dict[str, str]:
        """Every partition's preferred node (cornus.protocol.ownership.placement)."""
        return placement(self.partitions, self.peers, self.partition_owners)

    @property
    def preferred_partitions(self) -> tuple[str, ...]:
        return tuple(p for p, node in self.placement().items() if node == self.node_id)


def check_peers(peers: Mapping[str, str]) -> None:
    """A node set as a node accepts it: 1..NODE_COUNT_MAX node ids, each with a host:port."""
    if not peers or len(peers) > NODE_COUNT_MAX:
        raise ValidationError(f"peers must list 1..{NODE_COUNT_MAX} nodes, this one included")
    for node, address in peers.items():
        validate_id(node, "peer node id", NODE_ID_LENGTH_MAX)
        if _PARTITION_NAME.fullmatch(node):
            # Nodes and partitions share one address space, a message's destination (found by
            # audit, 2026-11-28: every node sent partition p1's messages to node p1). Any count's
            # name: the count is the cluster record's, which a node reads only after this check.
            raise ValidationError(f"peer node id {node!r} is a partition's name (p<number>): name the node otherwise")
        _check_address(address, f"address of peer {node}")
    at: dict[str, str] = {}
    for node, address in peers.items():
        if address in at:
            # Found by audit (2026-11-27): taken, one of the two was unreachable for ever.
            raise ValidationError(f"peers {at[address]} and {node} have the same address {address}")
        at[address] = node


def parse_peers(raw: str) -> dict[str, str]:
    """A peer list in the form of CORNUS_PEERS ("n0=host:port,n1=host:port"), checked as a node
    checks its own, with no node named twice (found by audit: the last address was kept)."""
    names = [item.partition("=")[0].strip() for item in raw.split(",") if item.strip()]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValidationError(f"peers name {', '.join(repeated)} more than once")
    peers = _parse_peers(raw)
    check_peers(peers)
    return peers


def _check_address(address: object, what: str) -> None:
    if not isinstance(address, str) or not _ADDRESS.match(address):
        raise ValidationError(f"{what} must look like host:port, got {address!r}")
    host, port_text = address.rsplit(":", 1)
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValidationError(f"{what}: port {port} is out of range")
    # A connect encodes a name with IDNA, which refuses an empty label or one longer than DNS
    # allows: such a host passed the pattern, and its link failed for ever (found by audit,
    # 2026-11-28, second). An IPv6 host (it has colons) has no labels; one trailing dot (the root)
    # is a fully qualified name.
    if ":" not in host:
        for label in host.removesuffix(".").split("."):
            if not 0 < len(label) <= DNS_LABEL_LENGTH_MAX:
                raise ValidationError(
                    f"{what}: host {host!r} has an empty DNS label or one over {DNS_LABEL_LENGTH_MAX} characters")


def _parse_peers(raw: str) -> dict[str, str]:
    peers: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        node, sep, address = item.partition("=")
        if not sep:
            raise ValidationError(f"peers entry {item!r} must be node=host:port")
        peers[node.strip()] = address.strip()
    return peers


def _table(value: object, what: str) -> Mapping[str, Any]:
    """`value` if it is a table (a TOML file may give anything), else the error that names it."""
    if not isinstance(value, Mapping):
        raise ValidationError(f"{what} must be a table (in a file: [{what}] with name = value lines), got {value!r}")
    return value


def _int(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise ValidationError(f"{what} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    raise ValidationError(f"{what} must be an integer, got {value!r}")


def _ownership_names() -> set[str]:
    # The clock slack is the protocol's; ownership takes it from there.
    return {item.name for item in dataclasses.fields(OwnershipConfig)} - {"clock_slack_ms"}


def _split_timeouts(values: Mapping[str, object]) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    protocol_names = {item.name for item in dataclasses.fields(ProtocolConfig)}
    limit_names = {item.name for item in dataclasses.fields(RuntimeLimits)}
    protocol_values: dict[str, int] = {}
    limit_values: dict[str, int] = {}
    ownership_values: dict[str, int] = {}
    for name, value in values.items():
        if name in protocol_names or name in _ownership_names():
            target = protocol_values if name in protocol_names else ownership_values
            target[name] = _int(value, name)
            if target[name] <= 0:
                raise ValidationError(f"{name} must be positive, got {value!r}")
        elif name in limit_names:
            limit_values[name] = _int(value, name)
        else:
            raise ValidationError(f"unknown timeout or limit {name!r}")
    return protocol_values, limit_values, ownership_values


def timeout_names_all() -> set[str]:
    """Every timeout and limit a node takes (ProtocolConfig, RuntimeLimits, OwnershipConfig fields)."""
    return (
        {item.name for item in dataclasses.fields(ProtocolConfig)}
        | {item.name for item in dataclasses.fields(RuntimeLimits)}
        | _ownership_names()
    )


def _is_timer(name: str) -> bool:
    # Not the tombstones' keep, which storage counts, not a timer of ours.
    return (name.endswith(("_ms", "_ms_max")) or name.startswith(("timeout_ms_", "backoff_ms_"))) and (
        name != "outcome_keep_ms")


def timeout_maxima() -> dict[str, int]:
    """The largest value a node takes for each timeout and limit it can be given (CORNUS_<NAME>),
    each on its own; combinations have rules of their own, checked at start. The chart's schema
    states the same bounds (a value it let through, the node refused, and every pod restarted in
    a loop: found by review; tests/deploy checks the two agree)."""
    settable = timeout_names_all() - {"storage_deadline_ms", "late_write_window_ms"}
    maxima = {name: TIMER_MS_MAX for name in settable if _is_timer(name)}
    maxima.update(_LIMIT_MAX)
    maxima.update({
        "lease_ms": OWNER_LEASE_MS_MAX,
        "renew_interval_ms": OWNER_LEASE_MS_MAX // 2,  # at most half the lease
        "outcome_keep_ms": TOMBSTONE_KEEP_MS_MAX,
        "scan_page_count_max": SCAN_PAGE_COUNT_MAX,
        "gc_attempt_count_max": GC_ATTEMPT_COUNT_MAX,
    })
    assert set(maxima) == settable, sorted(settable ^ set(maxima))
    return maxima


def _ownership_config(values: Mapping[str, int], protocol_config: ProtocolConfig, backend: str) -> OwnershipConfig:
    """OwnershipConfig asserts its rules (it is the pure core's); user input gets clear errors."""
    merged = {**dataclasses.asdict(OwnershipConfig()), **values, "clock_slack_ms": protocol_config.clock_slack_ms}
    if merged["lease_ms"] > OWNER_LEASE_MS_MAX:
        raise ValidationError(f"lease_ms is {merged['lease_ms']}, the limit is {OWNER_LEASE_MS_MAX}")
    for name in ("failover_delay_ms", "drain_ms_max"):
        # A node that waited longer than this before taking a dead node's partitions, or for a
        # hand-over, left them unserved past any client's patience.
        if merged[name] > TIMER_MS_MAX:
            raise ValidationError(f"{name} is {merged[name]}, more than its maximum {TIMER_MS_MAX} (an hour)")
    if merged["renew_interval_ms"] < RENEW_INTERVAL_MS_MIN:
        raise ValidationError(
            f"renew_interval_ms is {merged['renew_interval_ms']}, the least is {RENEW_INTERVAL_MS_MIN}: every node "
            "reads every partition's ownership record that often"
        )
    if 2 * merged["renew_interval_ms"] > merged["lease_ms"]:
        raise ValidationError(
            f"renew_interval_ms ({merged['renew_interval_ms']}) must be at most half of lease_ms "
            f"({merged['lease_ms']}): one slow renewal must not end a lease"
        )
    if backend == "azure_blob" and merged["lease_ms"] < merged["renew_interval_ms"] + AZURE_LEASE_MARGIN_MS:
        raise ValidationError(
            f"lease_ms ({merged['lease_ms']}) must be at least renew_interval_ms ({merged['renew_interval_ms']}) "
            f"+ {AZURE_LEASE_MARGIN_MS} on azure_blob: a fenced write there must land before the lease its ownership "
            "record grants ends, counted from the record's Last-Modified (whole seconds)"
        )
    return OwnershipConfig(**merged)


def _protocol_config(values: Mapping[str, int], storage: StoreConfig) -> ProtocolConfig:
    """ProtocolConfig guards itself with asserts (it is the pure core's); user input must get a
    clear error instead, so its cross-field rules are checked here first. The storage deadline is
    the storage's own call timeout, never set twice."""
    if "storage_deadline_ms" in values:
        raise ValidationError("storage_deadline_ms is the storage timeout_ms_call; set that one instead")
    if "late_write_window_ms" in values:
        raise ValidationError("late_write_window_ms is the storage backend's own (how late its requests may land)")
    merged = {**dataclasses.asdict(ProtocolConfig()), **values, "storage_deadline_ms": storage.timeout_ms_call,
              "late_write_window_ms": storage.late_write_window_ms}
    keep_ms_min = outcome_keep_ms_min(merged["storage_deadline_ms"], merged["clock_slack_ms"],
                                      merged["late_write_window_ms"])
    if "outcome_keep_ms" not in values:
        # The default keep, lengthened where the backend's requests may land later than it.
        merged["outcome_keep_ms"] = max(merged["outcome_keep_ms"], keep_ms_min)
    elif merged["outcome_keep_ms"] < OUTCOME_KEEP_MS_FLOOR:
        raise ValidationError(
            f"outcome_keep_ms is {merged['outcome_keep_ms']}, but the status call counts on every node keeping "
            f"its transactions' outcomes a minute at least (a coordinator restarted since a transaction began "
            f"cannot tell what its previous process kept): outcome_keep_ms must be at least {OUTCOME_KEEP_MS_FLOOR}"
        )
    elif merged["outcome_keep_ms"] < keep_ms_min:
        raise ValidationError(
            f"outcome_keep_ms is {merged['outcome_keep_ms']}, but on {storage.backend} a request may land up to "
            f"{storage.late_write_window_ms} ms after its deadline (timeout_ms_call {merged['storage_deadline_ms']}, "
            f"plus clock_slack_ms {merged['clock_slack_ms']}): the tombstones garbage collection leaves must "
            f"outlive it, or a late vote could recreate a collected record; outcome_keep_ms must be at least "
            f"{keep_ms_min}"
        )
    if merged["backoff_ms_min"] > merged["backoff_ms_max"]:
        raise ValidationError("backoff_ms_min must not exceed backoff_ms_max")
    if merged["timeout_ms_resend"] > merged["backoff_ms_max"]:
        # A coordinator's decision resends back off from the one to the other (found by audit,
        # 2026-11-28: accepted, every node crashed on its first commit).
        raise ValidationError(
            f"timeout_ms_resend ({merged['timeout_ms_resend']}) must not exceed backoff_ms_max "
            f"({merged['backoff_ms_max']}): a coordinator's resends of its decision back off from the one to the other"
        )
    grace_min = gc_grace_ms_min(merged["storage_deadline_ms"], merged["clock_slack_ms"])
    if merged["gc_grace_ms"] < grace_min:
        raise ValidationError(
            f"gc_grace_ms is {merged['gc_grace_ms']}, but a storage call may land up to its deadline (storage "
            f"timeout_ms_call {merged['storage_deadline_ms']}) plus clock_slack_ms ({merged['clock_slack_ms']}) "
            f"after it was made, and a manual resolve makes two in a row: gc_grace_ms must be at least "
            f"2 * timeout_ms_call + clock_slack_ms = {grace_min}, or a late call could recreate a collected record"
        )
    if merged["scan_page_count_max"] > SCAN_PAGE_COUNT_MAX:
        raise ValidationError(f"scan_page_count_max must be at most {SCAN_PAGE_COUNT_MAX}")
    if merged["outcome_keep_ms"] > TOMBSTONE_KEEP_MS_MAX:
        raise ValidationError(
            f"outcome_keep_ms is {merged['outcome_keep_ms']}, more than its maximum {TOMBSTONE_KEEP_MS_MAX} (a week)"
        )
    for name, value in merged.items():
        if _is_timer(name) and isinstance(value, int) and value > TIMER_MS_MAX:
            raise ValidationError(f"{name} is {value}, more than its maximum {TIMER_MS_MAX} (an hour)")
    if merged["gc_attempt_count_max"] > GC_ATTEMPT_COUNT_MAX:
        raise ValidationError(f"gc_attempt_count_max must be at most {GC_ATTEMPT_COUNT_MAX}")
    return ProtocolConfig(**merged)


def parse_lock_policy(value: object) -> Policy:
    """`no_wait` or `wait_die`, in either case (`NO_WAIT` is how the paper spells it)."""
    if isinstance(value, Policy):
        return value
    try:
        return Policy(str(value).strip().lower())
    except ValueError:
        raise ValidationError(
            f"lock_policy {value!r} is not one of {', '.join(p.value for p in Policy)}"
        ) from None


def load_node_config(
    path: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> NodeConfig:
    """File, then environment, then `overrides` (flags; None values are ignored)."""
    environ = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise ValidationError(f"config file {path}: {error}") from error
    known = {"node_id", "cluster_id", "listen", "api_listen", "grpc_api_listen", "protocol", "lock_policy",
             "partition_count", "peers", "partition_owners", "storage", "timeouts", "peer_tls", "admin_token"}
    unknown = set(raw) - known
    if unknown:
        raise ValidationError(f"config file {path}: unknown keys {', '.join(sorted(unknown))}")
    for name in ("node_id", "cluster_id", "listen", "api_listen", "grpc_api_listen", "protocol", "lock_policy",
                 "partition_count", "admin_token"):
        if f"CORNUS_{name.upper()}" in environ:
            raw[name] = environ[f"CORNUS_{name.upper()}"]
    if "CORNUS_PEERS" in environ:
        raw["peers"] = parse_peers(environ["CORNUS_PEERS"])
    timeouts = dict(_table(raw.get("timeouts", {}), "timeouts"))
    timeout_names = timeout_names_all()
    for name in timeout_names:
        if f"CORNUS_{name.upper()}" in environ:
            timeouts[name] = environ[f"CORNUS_{name.upper()}"]
    overrides = {key: value for key, value in (overrides or {}).items() if value is not None}
    storage_names = {f"storage_{item.name}" for item in dataclasses.fields(StoreConfig)}
    peer_tls_names = {f"peer_tls_{name}" for name in _PEER_TLS_FIELDS}
    unknown = set(overrides) - known - timeout_names_all() - storage_names - peer_tls_names
    if unknown:
        raise ValidationError(f"unknown settings: {', '.join(sorted(unknown))}")
    storage_flags: dict[str, Any] = {}
    peer_tls_values = dict(_table(raw.get("peer_tls", {}), "peer_tls"))
    for name in _PEER_TLS_FIELDS:
        if f"CORNUS_PEER_TLS_{name.upper()}" in environ:
            peer_tls_values[name] = environ[f"CORNUS_PEER_TLS_{name.upper()}"]
    for key, value in overrides.items():
        if key in timeout_names:
            timeouts[key] = value
        elif key == "peers" and isinstance(value, str):
            raw["peers"] = parse_peers(value)
        elif key.startswith("storage_"):
            storage_flags[key.removeprefix("storage_")] = value
        elif key in peer_tls_names:
            peer_tls_values[key.removeprefix("peer_tls_")] = value
        else:
            raw[key] = value

    storage_file = _table(raw.get("storage", {}), "storage")
    storage_fields = {item.name for item in dataclasses.fields(StoreConfig)}
    unknown = set(storage_file) - storage_fields
    if unknown:
        raise ValidationError(f"unknown storage settings: {', '.join(sorted(unknown))}")
    storage_values = {**storage_file, **env_values(environ), **storage_flags}
    if "timeout_ms_call" in storage_values:
        storage_values["timeout_ms_call"] = _int(storage_values["timeout_ms_call"], "storage timeout_ms_call")
    try:
        storage = StoreConfig(**storage_values)
    except TypeError as error:
        raise ValidationError(f"storage settings: {error}") from error
    protocol_values, limit_values, ownership_values = _split_timeouts(timeouts)
    if "node_id" not in raw:
        raise ValidationError("node_id is required (file, CORNUS_NODE_ID or --node-id)")
    if "peers" not in raw:
        raise ValidationError("peers are required (file [peers], CORNUS_PEERS or --peers)")
    protocol_raw = raw.get("protocol", Protocol.CORNUS.value)
    try:
        protocol = Protocol(protocol_raw)
    except ValueError:
        raise ValidationError(
            f"protocol {protocol_raw!r} is not one of {', '.join(p.value for p in Protocol)}"
        ) from None
    return NodeConfig(
        lock_policy=parse_lock_policy(raw.get("lock_policy", Policy.NO_WAIT.value)),
        node_id=raw["node_id"],
        cluster_id=raw.get("cluster_id", DEFAULT_CLUSTER_ID),
        peers=dict(_table(raw["peers"], "peers")),
        listen=raw.get("listen", ""),
        api_listen=raw.get("api_listen", ""),
        grpc_api_listen=raw.get("grpc_api_listen", ""),
        protocol=protocol,
        partition_count=_int(raw.get("partition_count", 0), "partition_count"),
        partition_owners=dict(_table(raw.get("partition_owners", {}), "partition_owners")),
        storage=storage,
        protocol_config=(protocol_config := _protocol_config(protocol_values, storage)),
        limits=RuntimeLimits(**limit_values),
        ownership=_ownership_config(ownership_values, protocol_config, storage.backend),
        peer_tls=_peer_tls_config(peer_tls_values),
        admin_token=raw.get("admin_token", ""),
    )


_PEER_TLS_FIELDS = tuple(item.name for item in dataclasses.fields(PeerTlsConfig))


def _peer_tls_config(values: Mapping[str, Any]) -> PeerTlsConfig | None:
    """None when no TLS setting is given; else every file, each usable (checked by building the
    contexts, so a wrong path or a key that does not match its certificate stops the node here)."""
    if not values:
        return None
    unknown = set(values) - set(_PEER_TLS_FIELDS)
    if unknown:
        raise ValidationError(f"unknown peer_tls settings: {', '.join(sorted(unknown))}")
    missing = [name for name in ("cert_file", "key_file", "ca_file") if not values.get(name)]
    if missing:
        raise ValidationError(f"peer_tls needs {', '.join(missing)} as well (TLS takes all three files)")
    config = PeerTlsConfig(cert_file=values["cert_file"], key_file=values["key_file"], ca_file=values["ca_file"],
                           verify_hostname=_bool(values.get("verify_hostname", True), "peer_tls verify_hostname"))
    config.contexts()
    return config


def _bool(value: object, what: str) -> bool:
    """A setting given as a TOML boolean, or as text from the environment or a flag."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValidationError(f"{what} must be true or false, got {value!r}")


def _check_late_votes(limits: RuntimeLimits, protocol_config: ProtocolConfig) -> None:
    """The core's rule (status.late_votes_meet_their_tombstone), said in the settings' names."""
    pc, request_ms = protocol_config, limits.timeout_ms_peer_request
    if not late_votes_meet_their_tombstone(request_ms, pc):
        raise ValidationError(
            f"timeout_ms_peer_request is {request_ms}: a one-shot's vote may land up to {late_vote_ms(request_ms, pc)} "
            f"ms after its begin (that, twice clock_slack_ms {pc.clock_slack_ms}, the storage timeout_ms_call "
            f"{pc.storage_deadline_ms}, the slack again and the backend's late window "
            f"{pc.late_write_window_ms}), after its records were collected (gc_grace_ms {pc.gc_grace_ms}) and its "
            f"tombstone dropped (outcome_keep_ms {pc.outcome_keep_ms}): lower timeout_ms_peer_request or raise "
            f"outcome_keep_ms"
        )
