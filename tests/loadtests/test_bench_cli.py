"""`cornus bench` and `cornus termination-bench` as a user runs them, on the embedded emulator:
the README's first command (the three protocols on YCSB with the azure-blob latency profile), the
TPC-C and bank workloads with their invariant checks, files written, and bad input refused before
anything starts. Short runs: these check that the figures are produced and hang together, never
how fast anything is."""

from __future__ import annotations

import csv
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

from cornus.protocol.config import Protocol
from loadtests.bench import cloud, lifecycle, termination
from loadtests.bench.cluster import RunResult, RunSettings
from loadtests.bench.driver import NOT_COMMITTED_KIND_COUNT_MAX, DriverResult
from loadtests.bench.report import format_ratios, markdown_summary, median_trial, ratio_rows, summarize
from loadtests.bench.sweep import BenchPlan, write_outputs
from loadtests.bench.termination import NodeTermination
from loadtests.workloads.base import Reply
from services.cli import main
from storage_adapters.factory import StoreConfig

TIMEOUT_S_BENCH = 240
# A starting node waits out one storage deadline before it serves; a short one keeps tests short.
FAST_START = ("--timeout-ms-call", "500")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.timeout(TIMEOUT_S_BENCH + 30)


def _cornus(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S_BENCH, check=False)


def _rows(out: Path) -> list[dict[str, str]]:
    with (out / "results.csv").open() as handle:
        return list(csv.DictReader(handle))


def _assert_plots(out: Path, *names: str) -> None:
    for name in names:
        assert (out / name).read_bytes().startswith(PNG_MAGIC), name


def test_readme_headline_compares_the_three_protocols_with_the_azure_blob_profile(tmp_path):
    out = tmp_path / "out"
    done = _cornus("bench", "--latency", "azure-blob", "--seconds", "2", "--clients", "3", "--out", str(out),
                   *FAST_START)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "injected latency azure-blob (fixed:10.4;log=fixed:10.29)" in done.stdout
    rows = {row["protocol"]: row for row in _rows(out)}
    assert set(rows) == {"cornus", "2pc", "coordinator-log"}, rows
    for protocol, row in rows.items():
        assert float(row["commits_per_s"]) > 0 and int(row["dist_commits"]) > 0, (protocol, row)
        assert float(row["dist_avg_ms"]) <= float(row["dist_p99_ms"]), (protocol, row)
        # The injected 10.4 ms is inside every vote write the nodes timed.
        assert max(float(row["w_log_once_ms"]), float(row["w_log_ms"])) >= 10.4, (protocol, row)
        assert float(row["node_cpu_ms"]) > 0 and float(row["driver_cpu_ms"]) > 0, (protocol, row)
        assert float(row["cache_hit_pct"]) > 0, (protocol, row)  # the load phase filled the owners' caches
        assert row["violations"] == "0" and row["errors"] == "0", (protocol, row)
    # 2PC and coordinator-log log a decision before replying; Cornus does not.
    assert float(rows["2pc"]["commit_ms"]) > 10 > float(rows["cornus"]["commit_ms"]), rows
    assert float(rows["coordinator-log"]["commit_ms"]) > 10, rows
    assert "2PC/Cornus avg" in done.stdout and "coordinator-log/Cornus avg" in done.stdout
    summary = (out / "summary.md").read_text()
    assert "2PC/Cornus commit path" in summary and "Invariant checks: all passed" in summary
    _assert_plots(out, "latency.png", "breakdown.png", "throughput.png")
    assert str(out / "results.csv") in done.stdout


@pytest.mark.parametrize(("workload", "extra", "kinds"), [
    ("tpcc", ("--warehouses", "2", "--knob", "customers=5", "--items", "100"), {"new_order", "payment"}),
    ("bank", ("--accounts", "12", "--audit-clients", "1"), {"transfer", "audit"}),
])
def test_workloads_run_and_pass_their_invariant_checks(tmp_path, workload, extra, kinds):
    out = tmp_path / "out"
    done = _cornus("bench", "--workload", workload, "--protocol", "cornus", "--nodes", "2", "--seconds", "1.5",
                   "--clients", "3", "--out", str(out), "--no-plots", *extra, *FAST_START)
    assert done.returncode == 0, done.stdout + done.stderr
    [row] = _rows(out)
    committed = {kind.split(":")[0]: int(kind.split(":")[1].split("/")[0]) for kind in row["kinds"].split()}
    assert set(committed) == kinds and all(committed.values()), row
    assert row["violations"] == "0" and row["errors"] == "0", row
    assert "Invariant checks: all passed" in (out / "summary.md").read_text()
    assert not list(out.glob("*.png"))


@pytest.mark.parametrize(("args", "message"), [
    (["--seconds", "0"], "--seconds"),
    (["--clients", "0"], "--clients"),
    (["--latency", "soon"], "latency 'soon'"),
    (["--set", "no_such=1"], "no_such"),
    (["--theta", "2"], "theta must be a number in [0, 0.99]"),
    (["--workload", "tpcc", "--theta", "0.5"], "--theta is not a knob of the tpcc workload"),
    (["--sweep", "bogus=1,2"], "--sweep bogus: not a parameter of ycsb"),
    (["--sweep", "theta=0.1,1.5"], "theta must be a number in [0, 0.99]"),
    (["--sweep", "nodes=2,x"], "'x' is not an integer"),
    (["--knob", "warehouses=3"], "--knob 'warehouses=3'"),
    (["--workload", "uniform", "--partitions-per-txn", "9"], "partitions_per_txn must be an integer in 1..3"),
    (["--flush-redis"], "--flush-redis is for --backend redis"),
    # Each point's partition count differs, and a Redis database keeps its first (the cluster record).
    (["--backend", "redis", "--redis-url", "redis://127.0.0.1:1/0", "--sweep", "nodes=2,3"],
     "--sweep nodes over Redis changes the partition count at each point"),
    (["--keep-storage"], "--keep-storage is for --backend azure_blob or dynamodb"),
    (["--set", "timeout_ms_prepare=abc"], "timeout_ms_prepare must be an integer"),
    (["--set", "timeout_ms_prepare=0"], "timeout_ms_prepare must be positive"),
    (["--out", __file__], f"{__file__} is not a directory"),
    (["--out", f"{__file__}/out"], f"{__file__} is not a directory"),
    (["--sweep", "lock_policy=NO_WAIT,no_wait"], "'NO_WAIT' and 'no_wait' are the same point"),
    (["--sweep", "theta=0.1,0.10"], "'0.1' and '0.10' are the same point"),
    (["--rows-per-partition", "400000"], "ycsb would load 1,200,000 keys (400,000 rows_per_partition x 3"),
    # The first point is within the bound, the second is not: nothing runs at all.
    (["--rows-per-partition", "300000", "--sweep", "nodes=2,4"], "ycsb would load 1,200,000 keys"),
])
def test_bench_refuses_bad_input_before_starting_anything(tmp_path, args, message):
    done = _cornus("bench", "--out", str(tmp_path / "out"), *args)
    assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
    assert not (tmp_path / "out").exists()


def test_termination_bench_times_termination_after_coordinator_kills(tmp_path):
    rounds = 2
    out = tmp_path / "out"
    done = _cornus("termination-bench", "--rounds", str(rounds), "--sweep", "nodes=3", "--out", str(out), *FAST_START)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.split()[:1] in (["n1"], ["n2"])}
    assert set(rows) == {"n1", "n2"}, done.stdout  # every participant ran termination, every round
    for node, row in rows.items():
        count, min_ms, p50_ms, max_ms = int(row[1]), float(row[2]), float(row[3]), float(row[5])
        assert count == rounds, (node, row)
        assert 0 < min_ms <= p50_ms <= max_ms, (node, row)
    with (out / "termination.csv").open() as handle:
        [summary] = list(csv.DictReader(handle))
    assert summary["nodes"] == "3" and int(summary["terminations"]) == 2 * rounds, summary
    assert 0 < float(summary["p50_ms"]) <= float(summary["max_ms"]), summary
    _assert_plots(out, "termination.png")


@pytest.mark.parametrize(("args", "message"), [
    (["--nodes", "2"], "--nodes"), (["--rounds", "0"], "--rounds"), (["--sweep", "theta=1"], "sweeps nodes only"),
    (["--sweep", "nodes=3,99"], "--nodes must be in 3..16"), (["--sweep", "nodes=,"], "no node count"),
    (["--set", "timeout_ms_prepare=abc"], "timeout_ms_prepare must be an integer"),
    (["--out", __file__], f"{__file__} is not a directory"),
    (["--keep-storage"], "--keep-storage is for --backend azure_blob or dynamodb"),
    (["--flush-redis"], "--flush-redis is for --backend redis"),
    # One partition per node: each point's count differs, and a Redis database keeps its first.
    (["--backend", "redis", "--redis-url", "redis://127.0.0.1:1/0", "--sweep", "nodes=3,4"],
     "--sweep nodes over Redis changes the partition count at each point"),
])
def test_termination_bench_refuses_bad_input(args, message):
    done = _cornus("termination-bench", *args)
    assert done.returncode == 2 and message in done.stderr, (args, done.stderr)


# One results row, as loadtests.bench.report.summarize makes them, for the tests without a cluster.
ROW = {"param": "latency", "value": "none", "workload": "ycsb", "kinds": "", "commits_per_s": 1.0,
       "abort_rate": 0.0, "dist_avg_ms": 5.0, "dist_p99_ms": 9.0, "execution_ms": 1.0, "prepare_ms": 2.0,
       "commit_ms": 0.1, "w_log_once_ms": 2.0, "w_log_ms": 0.0, "rw_dist_avg_ms": 5.0, "rw_commit_path_ms": 2.1,
       "node_total_ms": 3.1, "node_cpu_ms": 1.0, "driver_cpu_pct": 5.0}


def test_a_summary_says_why_a_point_has_no_ratio():
    """A protocol that committed no distributed transaction in its window (moto under a loaded
    suite, say) leaves its point without a ratio; the summary says so instead of leaving it out."""
    row = ROW
    rows = [{**row, "protocol": "cornus", "dist_commits": 4}, {**row, "protocol": "2pc", "dist_commits": 0}]
    summary = markdown_summary(rows, title="t", command="c", machine="m", violations=[], files=[])
    assert "latency=none: 2PC/Cornus n/a: 2pc committed no distributed transaction" in summary, summary


def test_the_ratios_count_the_client_and_the_coordinator_apart():
    """The client's latency holds its HTTP round trip, which the paper's artifact does not count;
    the coordinator's total (execution + prepare + commit at its node) is the artifact's measure."""
    rows = [{**ROW, "protocol": "cornus", "dist_commits": 4},
            {**ROW, "protocol": "2pc", "dist_commits": 4, "dist_avg_ms": 8.0, "node_total_ms": 6.2}]
    [entry] = ratio_rows(rows)
    assert (entry["2pc_avg"], entry["2pc_node_avg"]) == (1.6, 2.0)
    assert "2PC/Cornus avg 1.60x (at the coordinator 2.00x)" in format_ratios(rows)
    summary = markdown_summary(rows, title="t", command="c", machine="m", violations=[], files=[])
    assert "| latency=none | 1.6 | 2.0 |" in summary, summary


def test_without_matplotlib_the_results_are_written_and_the_plots_said_skipped(tmp_path, monkeypatch, capsys):
    """plots.py imports matplotlib only when it draws, so a missing matplotlib shows at the drawing
    call, after the measurements: the CSV and the summary must still be written."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    plan = BenchPlan(protocols=[Protocol.CORNUS], storage=StoreConfig(), storage_argv=lambda storage: [],
                     base=RunSettings(), out_dir=tmp_path / "bench", command="c")
    files = write_outputs(plan, [{**ROW, "protocol": "cornus", "dist_commits": 4}], [])
    assert [path.name for path in files] == ["results.csv", "summary.md"]
    assert "plots skipped: matplotlib is not installed (pip install -e '.[bench]')" in capsys.readouterr().err

    rows = [NodeTermination("n1", 2, 1.0, 2.0, 3.0, 3.0), NodeTermination("n2", 2, 1.0, 2.0, 3.0, 3.0)]
    monkeypatch.setattr(termination, "run_termination_bench", lambda *args, **kwargs: rows)
    out = tmp_path / "termination"
    assert main(["termination-bench", "--rounds", "2", "--out", str(out)]) == 0
    assert (out / "termination.csv").exists() and not (out / "termination.png").exists()
    assert "plots skipped: matplotlib is not installed (pip install -e '.[bench]')" in capsys.readouterr().err


def test_a_bench_whose_cluster_does_not_start_exits_1_with_one_line_naming_the_logs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the run's node logs go
    def start(node: lifecycle.ClusterNode, *args: object, **kwargs: object) -> None:
        node.process = subprocess.Popen([sys.executable, "-c", "pass"])  # a node that exits at once

    monkeypatch.setattr(lifecycle, "start_node", start)
    monkeypatch.setattr(lifecycle, "wait_cluster_ready", lambda *args: False)
    assert main(["bench", "--protocol", "cornus", "--seconds", "1", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    last = err.splitlines()[-1]
    assert last.startswith("cornus: bench failed: the cornus cluster did not start; node logs kept in "), err
    assert Path(last.rsplit(" ", 1)[1]).parent == tmp_path, last


@pytest.mark.parametrize("error", [RuntimeError("n0 did not restart"), httpx.ConnectError("connection refused"),
                                   subprocess.TimeoutExpired(["cornus", "serve"], 15)])
def test_a_termination_bench_that_fails_exits_1_with_one_line(monkeypatch, capsys, error):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(termination, "run_termination_bench", fail)
    assert main(["termination-bench", "--rounds", "1"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [f"cornus: termination-bench failed: {error}"], err


@pytest.mark.parametrize("command", ["bench", "termination-bench"])
def test_the_azure_connection_string_reaches_the_nodes_in_their_environment_not_argv(tmp_path, monkeypatch, command):
    """Anyone on the machine may read a process's argv (ps); its environment, only its owner."""
    secret = "DefaultEndpointsProtocol=http;AccountName=a;AccountKey=c2VjcmV0"
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the failed run's node logs stay
    started = []
    monkeypatch.setattr(lifecycle, "start_node", lambda node, peers, argv, settings=(), environ=None:
                        started.append((list(argv), dict(environ or {}))))
    monkeypatch.setattr(lifecycle, "wait_cluster_ready", lambda *args: False)
    # No Azure account behind this connection string: the run's container is taken as new.
    monkeypatch.setattr(cloud, "exists", lambda storage, name: False)
    monkeypatch.setattr(cloud, "delete", lambda storage, name: None)
    assert main([command, "--backend", "azure_blob", "--azure-connection-string", secret, "--azure-container", "c",
                 "--out", str(tmp_path / "out"),
                 *(["--protocol", "cornus", "--seconds", "1", "--no-plots"] if command == "bench" else [])]) == 1
    assert started
    for argv, environ in started:
        assert not any(secret in arg for arg in argv), argv
        assert environ["CORNUS_STORAGE_AZURE_CONNECTION_STRING"] == secret, environ


def test_a_bench_that_cannot_reach_its_cloud_storage_exits_1_with_one_line_and_starts_nothing(tmp_path, monkeypatch,
                                                                                             capsys):
    def unreachable(storage: StoreConfig, name: str) -> bool:
        raise TimeoutError("read timed out")

    started = []
    monkeypatch.setattr(cloud, "exists", unreachable)
    monkeypatch.setattr(lifecycle, "start_node", lambda *args, **kwargs: started.append(args))
    assert main(["bench", "--backend", "azure_blob", "--azure-connection-string", "UseDevelopmentStorage=true",
                 "--azure-container", "c", "--protocol", "cornus", "--seconds", "1", "--no-plots",
                 "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == ("cornus: bench failed: could not ask azure_blob whether container c-cornus0 "
                                    "exists (TimeoutError: read timed out)"), err
    assert not started and not (tmp_path / "out").exists()


def _trial(dist_avg_ms: float, dist_commits: int = 10, violations: tuple[str, ...] = (),
           errors: tuple[str, ...] = ()) -> tuple[dict[str, object], RunResult]:
    row = {**ROW, "protocol": "cornus", "dist_avg_ms": dist_avg_ms, "dist_commits": dist_commits,
           "commits_per_s": 100 / dist_avg_ms if dist_avg_ms else 0.0, "violations": len(violations), "trials": 1}
    result = RunResult("cornus", RunSettings(), "emulator", DriverResult(errors=list(errors)),
                       violations=list(violations))
    return row, result


def test_the_median_trial_is_kept_and_every_trial_is_reported():
    fast, middle, slow = _trial(3.0), _trial(5.0, violations=("lost a transfer",)), _trial(9.0, errors=("boom",))
    row, result = median_trial([slow, middle, fast])
    assert result is middle[1] and row["dist_avg_ms"] == 5.0
    assert row["trials"] == 3 and row["trial_dist_avg_ms"] == "9.00;5.00;3.00", row
    assert row["trial_commits_per_s"] == "11;20;33", row
    # A violation or program error of a trial that was not kept is still reported.
    assert result.violations == ["lost a transfer", "(trial 1) program error: boom"] and row["violations"] == 2
    # Even counts keep the lower middle; a trial that committed no distributed transaction is the slowest.
    assert median_trial([_trial(4.0), _trial(2.0)])[0]["dist_avg_ms"] == 2.0
    assert median_trial([_trial(0.0, dist_commits=0), _trial(7.0), _trial(8.0)])[0]["dist_avg_ms"] == 8.0


def test_trials_alternate_the_protocols_and_keep_the_median(tmp_path):
    out = tmp_path / "out"
    done = _cornus("bench", "--workload", "uniform", "--protocol", "cornus", "--protocol", "2pc", "--trials", "2",
                   "--seconds", "1", "--clients", "2", "--no-plots", "--out", str(out), *FAST_START)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 trials each (the median kept)" in done.stdout
    order = [line.split("] ", 1)[1].split(" ...")[0] for line in done.stderr.splitlines() if line.endswith(" ...")]
    # Each trial begins with another protocol (found by a review: the first always ran first, on
    # a machine not yet warm, in every trial).
    assert order == ["cornus (trial 1/2)", "2pc (trial 1/2)", "2pc (trial 2/2)", "cornus (trial 2/2)"], order
    rows = {row["protocol"]: row for row in _rows(out)}
    assert set(rows) == {"cornus", "2pc"}, rows
    for protocol, row in rows.items():
        trial_avgs = [float(value) for value in row["trial_dist_avg_ms"].split(";")]
        assert row["trials"] == "2" and len(trial_avgs) == 2, row
        assert float(row["dist_avg_ms"]) == pytest.approx(min(trial_avgs), abs=0.01), (protocol, row)
    assert "median dist avg of 2 trials" in (out / "summary.md").read_text()


def test_a_trial_count_out_of_bounds_is_refused_before_anything_runs(tmp_path):
    for trials in ("0", "10"):
        done = _cornus("bench", "--trials", trials, "--out", str(tmp_path / trials))
        assert done.returncode == 2 and f"--trials {trials}: between 1 and 9" in done.stderr, done.stderr
        assert "cornus bench:" not in done.stdout and not (tmp_path / trials).exists()


def test_attempts_that_did_not_commit_are_reported_by_outcome_and_reason_within_a_bound():
    """A run that commits little says why (the Azurite sweep that once aborted everything did not)."""
    result = DriverResult()
    for _ in range(3):
        result.count_not_committed(Reply("aborted", "conflict"))
    result.count_not_committed(Reply("unavailable", "partition_moving"))
    result.count_not_committed(Reply("failed"))
    for index in range(NOT_COMMITTED_KIND_COUNT_MAX + 5):
        result.count_not_committed(Reply("failed", f"ReadTimeout {index}"))
    assert len(result.not_committed) == NOT_COMMITTED_KIND_COUNT_MAX + 1  # and "other"
    assert result.not_committed["other"] == 8
    row = summarize(RunResult("cornus", RunSettings(), "emulator", result))
    kinds = row["not_committed"].split("; ")
    assert kinds[:3] == ["other=8", "aborted:conflict=3", "unavailable:partition_moving=1"], kinds
    assert len(kinds) == 6 and "failed:ReadTimeout 0=1" in kinds, kinds
