"""Named storage latency profiles for `cornus bench --latency`, after the storage the paper
measured (section 5.1.2): Azure Cache for Redis, a conditional write 1.96 ms on average, and Azure
Blob Storage with geo-redundant replication, 10.40 ms. A profile is a fixed delay at that average,
added by storage_adapters.latency to every storage call of the nodes on top of the backend's own
time, so a loopback backend stands in for the cloud service. Any `fixed:`, `uniform:` or
`lognormal:` spec passes through unchanged; `none` injects nothing."""

from __future__ import annotations

from storage_adapters.errors import ValidationError
from storage_adapters.latency import parse_latency

PROFILES: dict[str, str] = {
    "none": "",
    "redis-azure": "fixed:1.96",
    "azure-blob": "fixed:10.4",
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
