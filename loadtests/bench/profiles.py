"""Named storage latency profiles for `cornus bench --latency`, after the storage the paper
measured (Cornus, PVLDB 2022, section 5.1.2, "Compute Node Hardware and Storage Service"; the
figures are in its text, there is no table of them). A profile is a fixed delay per kind of call,
at the paper's average for it, added by storage_adapters.latency to every storage call of the
nodes on top of the backend's own time, so a loopback backend stands in for the cloud service.
Any `fixed:`, `uniform:` or `lognormal:` spec (one distribution for every call), or one with
`;CALL=SPEC` parts, passes through unchanged; `none` injects nothing.

What the paper measured, and which calls take it (found by audit: every call took the conditional
write's figure, the plain `log` writes of 2PC and coordinator-log too):

| profile       | storage in the paper               | conditional write | plain write |
|---------------|------------------------------------|-------------------|-------------|
| `redis-azure` | Azure Cache for Redis, Premium P4  | 1.96 ms           | 1.84 ms     |
| `azure-blob`  | Azure Blob Storage, GRS            | 10.40 ms          | 10.29 ms    |

- plain write: `log`, the write with which 2PC's and coordinator-log's participants log their
  votes and decisions, the coordinators theirs, and Cornus's participants their decisions, as the
  paper's protocols do with a plain write. (Its fence, an ownership check the paper's storage
  writes did not make, does not make it the paper's conditional write.)
- conditional write: `log_once` (the paper's LogOnce, a compare-and-swap), and this contract's
  other conditional writes: `apply_redo` (a checked move of a vote to COMMIT with its data, in
  place of a plain `log(COMMIT)` and a data write), `delete` (fenced; a tombstone refuses the
  other decision) and `write_owner` (a compare-and-swap of an ownership record).
- reads (`read`, `read_data`, `scan_unfinished_page`, `read_owners`, `list_identities`): the
  paper gives no read latency; they keep what every call took before, the conditional write's
  figure.
"""

from __future__ import annotations

from storage_adapters.errors import ValidationError
from storage_adapters.latency import parse_latency

# The default (every call not named) at the conditional write's figure, `log` at the plain one's.
PROFILES: dict[str, str] = {
    "none": "",
    "redis-azure": "fixed:1.96;log=fixed:1.84",
    "azure-blob": "fixed:10.4;log=fixed:10.29",
}


def resolve_latency(spec: str | None) -> str:
    """A profile name or a latency spec -> the spec the nodes take ("" for none); a bad one raises
    ValidationError naming it."""
    spec = (spec or "").strip()
    if not spec:
        return ""
    if spec in PROFILES:
        return PROFILES[spec]
    try:
        parse_latency(spec)
    except ValidationError as error:
        raise ValidationError(f"{error}, or a profile: {', '.join(PROFILES)}") from None
    return spec


def latency_label(spec: str | None) -> str:
    """How a report names a latency: the profile name and its spec, or the spec alone."""
    if not spec or spec.strip() == "none":
        return "none"
    spec = spec.strip()
    return f"{spec} ({PROFILES[spec]})" if spec in PROFILES else spec
