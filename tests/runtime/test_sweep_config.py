"""The node's sweep settings (RuntimeLimits.sweep_interval_ms, sweep_age_ms,
sweep_calls_per_s_max): every minute unless turned off, the least allowed age when none is given,
an age below it refused at start, and the node's budget of sweeper calls a positive integer."""

from __future__ import annotations

import pytest

from cornus.protocol.sweeper import sweep_age_ms_min
from cornus.runtime.config import load_node_config
from storage_adapters.errors import ValidationError

SETTINGS = {"node_id": "n0", "peers": "n0=127.0.0.1:7100", "partition_count": 2}


def test_sweeping_is_on_every_minute_unless_its_interval_is_0() -> None:
    sweep = load_node_config(environ={}, overrides=SETTINGS).sweep_config
    assert sweep is not None and sweep.interval_ms == 60_000
    assert load_node_config(environ={}, overrides={**SETTINGS, "sweep_interval_ms": 0}).sweep_config is None
    off = {**SETTINGS, "sweep_interval_ms": 0, "sweep_age_ms": 1}  # an age is not checked while off
    assert load_node_config(environ={}, overrides=off).sweep_config is None


def test_an_interval_alone_sweeps_at_the_least_age_the_settings_allow() -> None:
    config = load_node_config(environ={"CORNUS_SWEEP_INTERVAL_MS": "60000"}, overrides=SETTINGS)
    sweep = config.sweep_config
    assert sweep is not None and sweep.interval_ms == 60_000
    assert sweep.age_ms == sweep_age_ms_min(config.protocol_config, config.limits.timeout_ms_peer_request)
    assert sweep.timeout_ms_request == config.limits.timeout_ms_peer_request


def test_an_age_below_the_least_is_refused_and_one_at_it_taken() -> None:
    least = load_node_config(environ={}, overrides={**SETTINGS, "sweep_interval_ms": 1}).sweep_config
    assert least is not None
    at = load_node_config(environ={}, overrides={**SETTINGS, "sweep_interval_ms": 1, "sweep_age_ms": least.age_ms})
    assert at.sweep_config == least
    with pytest.raises(ValidationError, match=rf"sweep_age_ms is {least.age_ms - 1}, below {least.age_ms}"):
        load_node_config(environ={}, overrides={**SETTINGS, "sweep_interval_ms": 1, "sweep_age_ms": least.age_ms - 1})
    for name, bad in (("sweep_interval_ms", -1), ("sweep_age_ms", -1), ("sweep_interval_ms", 3_600_001)):
        with pytest.raises(ValidationError, match=name):
            load_node_config(environ={}, overrides={**SETTINGS, name: bad})


def test_the_node_s_sweeper_calls_are_bounded_by_a_positive_integer_rate() -> None:
    """sweep_calls_per_s_max (sweeper.SweepBudget): 200 a second unless set; what is not a
    positive integer up to its maximum is refused at start, naming the setting."""
    sweep = load_node_config(environ={}, overrides=SETTINGS).sweep_config
    assert sweep is not None and sweep.calls_per_s_max == 200
    sweep = load_node_config(environ={"CORNUS_SWEEP_CALLS_PER_S_MAX": "50"}, overrides=SETTINGS).sweep_config
    assert sweep is not None and sweep.calls_per_s_max == 50
    for bad, why in ((0, "must be a positive integer, got 0"), (-5, "must be a positive integer"),
                     (2.5, "must be an integer"), (True, "must be an integer"), ("many", "must be an integer"),
                     (100_001, "is 100001, more than its maximum 100000")):
        with pytest.raises(ValidationError, match=f"sweep_calls_per_s_max {why}"):
            load_node_config(environ={}, overrides={**SETTINGS, "sweep_calls_per_s_max": bad})
    for text in ("0", "", "1e3", "200.0"):
        with pytest.raises(ValidationError, match="sweep_calls_per_s_max"):
            load_node_config(environ={"CORNUS_SWEEP_CALLS_PER_S_MAX": text}, overrides=SETTINGS)
