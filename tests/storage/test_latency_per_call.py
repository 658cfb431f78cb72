"""`;CALL=SPEC` latency specs (storage_adapters.latency): a distribution per kind of storage call,
which the named profiles need (loadtests.bench.profiles: the paper measured plain writes faster
than conditional ones); a one-distribution spec still applies to every call."""

from __future__ import annotations

import pytest

from storage_adapters.errors import ValidationError
from storage_adapters.latency import (
    CALL_NAMES,
    CallLatencies,
    LatencyDistribution,
    LatencyInjectingStore,
    parse_latency,
)
from tests.storage.test_latency_injection import InstantStore


def test_a_spec_may_give_calls_their_own_distribution() -> None:
    spec = parse_latency("fixed:3; read = uniform:1:2 ;log=fixed:2")
    assert spec == CallLatencies(
        LatencyDistribution("fixed", 3.0),
        (("log", LatencyDistribution("fixed", 2.0)), ("read", LatencyDistribution("uniform", 1.0, 2.0))),
    )
    assert spec == parse_latency("log=fixed:2;read=uniform:1:2;fixed:3")  # one point, however spelled
    assert spec.for_call("log") == LatencyDistribution("fixed", 2.0)
    assert spec.for_call("log_once") == spec.for_call("delete") == LatencyDistribution("fixed", 3.0)
    store = LatencyInjectingStore(InstantStore(), spec, seed=1)
    assert (store.sample_ms("log"), store.sample_ms("write_owner")) == (2.0, 3.0)
    assert 1.0 <= store.sample_ms("read") <= 2.0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("log=fixed:2", "a part without CALL="),
        ("fixed:1;fixed:2", "one part without CALL="),
        ("fixed:1;", "one part without CALL="),
        ("fixed:1;write=fixed:2", "'write' is no call"),
        ("fixed:1;log=fixed:2;log=fixed:3", "log given twice"),
        ("fixed:1;log=fixed:-2", "within 0..10000 ms"),
        ("fixed:1;log=", "expected fixed:MS"),
    ],
)
def test_a_bad_per_call_spec_is_refused(spec: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        parse_latency(spec)


def test_one_distribution_specs_still_apply_to_every_call() -> None:
    for spec in ("fixed:2", "uniform:8:18", "lognormal:10:30"):
        distribution = parse_latency(spec)
        assert isinstance(distribution, LatencyDistribution)
        assert all(distribution.for_call(call) is distribution for call in CALL_NAMES)
