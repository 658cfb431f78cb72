"""The node settings `cornus bench` and `cornus cluster up` take with --set, checked before any
node starts, as the nodes will check them (services/cli.py)."""

from __future__ import annotations

import argparse

import pytest

from services.cli import _bench_node_settings, _set_overrides
from storage_adapters.errors import ValidationError
from storage_adapters.factory import StoreConfig


def test_set_takes_every_setting_a_node_takes_and_only_those() -> None:
    """Found by audit (2026-11-27): --set refused the ownership timings a node takes (lease_ms,
    renew_interval_ms, failover_delay_ms, drain_ms_max), and its list of names offered
    storage_deadline_ms and late_write_window_ms, which every node refuses."""
    assert _set_overrides(["lease_ms=4000", "drain_ms_max=2000"]) == {"lease_ms": "4000", "drain_ms_max": "2000"}
    for name in ("storage_deadline_ms", "late_write_window_ms", "no_such_limit"):
        with pytest.raises(ValidationError) as refused:
            _set_overrides([f"{name}=1"])
        assert "storage_deadline_ms" not in str(refused.value).split("is not one of", 1)[1], refused.value


def test_the_bench_checks_its_settings_against_the_backend_it_runs_on() -> None:
    """Found by audit (2026-11-27): checked against the emulator whatever the backend, a setting
    the chosen backend's nodes refuse (a tombstone keep shorter than DynamoDB's late window) passed,
    and every node died at its start, after the run had made its table."""
    args = argparse.Namespace(set=["outcome_keep_ms=60000"])
    _bench_node_settings(args, StoreConfig(backend="emulator", timeout_ms_call=2_000))  # fine there
    with pytest.raises(ValidationError, match="outcome_keep_ms"):
        _bench_node_settings(args, StoreConfig(backend="dynamodb", timeout_ms_call=2_000))


def test_the_bench_s_nodes_collect_garbage_within_a_run() -> None:
    """Found by a review (2026-11-27): with the production grace (12 s) every run of a few seconds
    ended before any collection, and measured a quarter fewer storage calls than a steady state
    makes. The bench's nodes take the least grace the rule allows, unless told otherwise."""
    storage = StoreConfig(backend="emulator", timeout_ms_call=2_000)
    settings = _bench_node_settings(argparse.Namespace(set=None), storage)
    assert "gc_grace_ms=4250" in settings, settings  # 2 deadlines and the bench's 250 ms slack
    chosen = _bench_node_settings(argparse.Namespace(set=["gc_grace_ms=20000"]), storage)
    assert "gc_grace_ms=20000" in chosen and "gc_grace_ms=4250" not in chosen, chosen
