"""The named latency profiles (loadtests.bench.profiles) give each kind of storage call the paper's
figure for it (section 5.1.2): a plain write (`log`) its plain-write average, `log_once` and the
other conditional writes the conditional one, reads what every call took before. Found by audit:
every call took the conditional write's figure."""

from __future__ import annotations

import statistics

import pytest

from loadtests.bench.profiles import PROFILES, latency_label, resolve_latency
from storage_adapters import latency
from storage_adapters.errors import ValidationError
from storage_adapters.latency import LatencyInjectingStore, parse_latency
from tests.storage.test_latency_injection import InstantStore

SAMPLE_COUNT = 100
PLAIN_WRITES = ("log",)
CONDITIONAL_WRITES = ("log_once", "apply_redo", "delete", "write_owner")
READS = ("read", "scan_unfinished_page", "scan_finished_page", "read_data", "read_owners", "list_identities")
ALL_CALLS = PLAIN_WRITES + CONDITIONAL_WRITES + READS
# The paper's averages in ms (section 5.1.2): conditional write, plain write. It gives no reads'.
PAPER_MS = {"redis-azure": (1.96, 1.84), "azure-blob": (10.40, 10.29)}


def test_the_calls_are_all_sorted() -> None:
    assert sorted(ALL_CALLS) == sorted(latency.CALL_NAMES)


@pytest.mark.parametrize("profile", PAPER_MS)
def test_each_call_takes_the_papers_figure_for_its_kind(profile: str) -> None:
    conditional_ms, plain_ms = PAPER_MS[profile]
    store = LatencyInjectingStore(InstantStore(), parse_latency(resolve_latency(profile)), seed=1)
    mean_ms = {call: statistics.mean(store.sample_ms(call) for _ in range(SAMPLE_COUNT)) for call in ALL_CALLS}
    expected_ms = {call: plain_ms if call in PLAIN_WRITES else conditional_ms for call in ALL_CALLS}
    assert mean_ms == pytest.approx(expected_ms)


def test_profiles_resolve_to_specs_the_nodes_parse_and_reports_name() -> None:
    for name, spec in PROFILES.items():
        assert resolve_latency(name) == spec
        if spec:
            assert isinstance(parse_latency(spec), latency.CallLatencies)
    assert latency_label("redis-azure") == "redis-azure (fixed:1.96;log=fixed:1.84)"
    assert latency_label("none") == latency_label("") == "none"
    # A spec passes through unchanged, a per-call one too.
    assert resolve_latency(" fixed:2 ") == "fixed:2"
    assert resolve_latency("fixed:3;read=fixed:1") == "fixed:3;read=fixed:1"
    with pytest.raises(ValidationError, match="or a profile: none, redis-azure, azure-blob"):
        resolve_latency("azure")

