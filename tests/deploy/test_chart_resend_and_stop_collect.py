"""Two of the chart's install-time refusals (cornus.validate in helm/cornus/templates/_helpers.tpl)
whose combinations rendered and then failed in the running pods: a decision's resend interval above
the backoff ceiling, and a stop's wait for collection shorter than the grace before collection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cornus.protocol.config import ProtocolConfig
from cornus.runtime.config import RuntimeLimits, load_node_config
from services.serve import SHUTDOWN_BUDGET_S_BUT_COLLECT
from tests.deploy.conftest import VALUES_FILES, find, render, render_error

_PROTOCOL, _LIMITS = ProtocolConfig(), RuntimeLimits()
# The storage deadline of the audit's case, and the least grace it forces (two deadlines and the
# node's default clock slack): above the node's default stop wait for collection.
_CALL_MS_SLOW = 10_000
_GRACE_MS_FOR_SLOW_CALL = 2 * _CALL_MS_SLOW + _PROTOCOL.clock_slack_ms
_MS_PER_S = 1_000


def _rendered_pod(helm_bin: str, sets: Sequence[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The node pod's spec of a Redis render with `sets`, and cornus-0's plain environment."""
    docs = render(helm_bin, VALUES_FILES["redis"], sets)
    spec = find(docs, "StatefulSet", "cornus")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    environ = {item["name"]: item["value"] for item in container["env"] if "value" in item}
    environ["CORNUS_NODE_ID"] = "cornus-0"
    environ["CORNUS_STORAGE_REDIS_URL"] = "redis://redis.example.internal:6379/0"
    return spec, environ


def test_a_resend_interval_above_the_backoff_ceiling_is_refused(helm_bin: str) -> None:
    """Found by audit (2026-11-28, second): the chart checked backoff_ms_min <= backoff_ms_max but
    not timeout_ms_resend <= backoff_ms_max, while every coordinator backs its decision resends off
    from the one to the other (Backoff asserts min <= max): `timeouts.backoff_ms_max=50` (or
    timeout_ms_resend=500) rendered, the pods became ready, and each node crashed on its first
    commit. The install is refused now, naming both values."""
    below = _PROTOCOL.timeout_ms_resend - 1
    error = render_error(helm_bin, VALUES_FILES["redis"], ["timeouts.backoff_ms_max=50"])
    assert f"timeouts.timeout_ms_resend ({_PROTOCOL.timeout_ms_resend})" in error, error
    assert "timeouts.backoff_ms_max (50)" in error, error
    error = render_error(helm_bin, VALUES_FILES["redis"], ["timeouts.timeout_ms_resend=500"])
    assert "timeouts.timeout_ms_resend (500)" in error, error
    assert f"timeouts.backoff_ms_max ({_PROTOCOL.backoff_ms_max})" in error, error
    error = render_error(helm_bin, VALUES_FILES["redis"], [f"timeouts.backoff_ms_max={below}"])
    assert "timeout_ms_resend" in error and "backoff_ms_max" in error, error
    # At the ceiling it installs, and the node takes it.
    _, environ = _rendered_pod(helm_bin, [f"timeouts.backoff_ms_max={_PROTOCOL.timeout_ms_resend}"])
    config = load_node_config(environ=environ)
    assert config.protocol_config.backoff_ms_max == config.protocol_config.timeout_ms_resend


def test_a_stop_wait_shorter_than_the_grace_before_collection_is_refused(helm_bin: str) -> None:
    """Found by audit (2026-11-28, second): storage.timeoutMsCall=10000 forces gc_grace_ms to
    21000 at least, while timeout_ms_stop_collect stayed at its 15000: the render passed, and
    each stopping node gave up waiting before its transactions' records could be collected, so
    every rolling restart left records in storage for ever. The install is refused unless the
    wait is 0 (no wait, chosen) or at least the grace, and the grace period must then cover it."""
    slow = [f"storage.timeoutMsCall={_CALL_MS_SLOW}", f"timeouts.gc_grace_ms={_GRACE_MS_FOR_SLOW_CALL}"]
    error = render_error(helm_bin, VALUES_FILES["redis"], slow)
    assert f"timeouts.timeout_ms_stop_collect ({_LIMITS.timeout_ms_stop_collect} ms)" in error, error
    assert f"timeouts.gc_grace_ms ({_GRACE_MS_FOR_SLOW_CALL} ms)" in error, error
    # 0: the user chose no wait, which the node takes as it is.
    _, environ = _rendered_pod(helm_bin, [*slow, "timeouts.timeout_ms_stop_collect=0"])
    assert load_node_config(environ=environ).limits.timeout_ms_stop_collect == 0
    # A wait as long as the grace: the default grace period (45 s) no longer covers the stop.
    waiting = [*slow, f"timeouts.timeout_ms_stop_collect={_GRACE_MS_FOR_SLOW_CALL}"]
    error = render_error(helm_bin, VALUES_FILES["redis"], waiting)
    assert "terminationGracePeriodSeconds" in error and "timeout_ms_stop_collect" in error, error
    stop_ms = SHUTDOWN_BUDGET_S_BUT_COLLECT * _MS_PER_S + _GRACE_MS_FOR_SLOW_CALL
    grace_s = int(stop_ms // _MS_PER_S) + 1
    spec, environ = _rendered_pod(helm_bin, [*waiting, f"terminationGracePeriodSeconds={grace_s}"])
    assert spec["terminationGracePeriodSeconds"] * _MS_PER_S > stop_ms
    config = load_node_config(environ=environ)
    assert config.limits.timeout_ms_stop_collect >= config.protocol_config.gc_grace_ms


def test_the_cloud_examples_choose_their_stop_wait(helm_bin: str) -> None:
    """Found by audit (2026-11-28, second): the Azure and DynamoDB examples set gc_grace_ms to
    300 s, beyond any stop wait a node allows (60 s), and left the wait at 15 s, which could never
    see a record collected. They now say 0 (no wait) themselves, and render."""
    for name in ("azure_blob", "dynamodb"):
        docs = render(helm_bin, VALUES_FILES[name])
        (container,) = find(docs, "StatefulSet", "cornus")["spec"]["template"]["spec"]["containers"]
        env = {item["name"]: item.get("value") for item in container["env"]}
        assert env["CORNUS_TIMEOUT_MS_STOP_COLLECT"] == "0", name
