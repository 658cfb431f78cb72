"""Figures of a `cornus bench` run: one flat row per (sweep point, protocol) for the CSV and the
plots, the table printed to the terminal, and the markdown summary with the latency ratios of 2PC
and coordinator-log over Cornus.

Latencies are the paper's: of committed distributed transactions (touching more than one
partition), as the client saw them from the first attempt to the commit (aborted attempts and
their retries included), averaged, with the 99th percentile beside. The breakdown splits that
average into five segments that add up to it (BREAKDOWN_SEGMENTS): the coordinating node's own
timing of the last attempt (execution, prepare, commit), the time lost to the attempts before it
(retries: the first attempt's start to the last one's, pauses included), and the rest, the
client's side of the last attempt (client/HTTP: its HTTP calls and the driver's own time). The
commit path is prepare + commit, over the distributed transactions that wrote (read-only ones
skip both phases). "At the coordinator" is the coordinating node's own total (execution + prepare
+ commit) averaged over the same transactions: what the paper's artifact counts, from the start
of a transaction at its node to its decision, without the caller's HTTP round trip.

Every figure covers one window, the measured one: from the warm-up boundary to the run's end, as
throughput does. Latencies, commits, attempts, aborts and kinds are of the transactions started in
it; CPU, storage calls, peer messages, W and the cache hit rate are what the nodes' counters and
/proc moved between a snapshot at the boundary and one at the end (loadtests.bench.cluster), per
transaction committed in it. Only `not_committed` (why attempts failed) and `run_commits` cover
the whole run, warm-up included: they are there to tell a run that hardly committed.

CPU per commit charges to the commits every CPU second the nodes spent in the window, including
fixed background work (lease renewals, identity checks, garbage-collection timers): at low
throughput that work dominates, so the figure compares protocols only at similar throughput.
node_cores (node CPU seconds over wall seconds) says how busy the nodes were, and node_idle_cores
is their rate with no clients, measured after the run, for the background alone.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from loadtests.bench.cluster import RunResult
from loadtests.bench.driver import TxnRecord

PROTOCOL_ORDER = ("cornus", "2pc", "coordinator-log")
CSV_FIELDS = (
    "param", "value", "protocol", "workload", "storage", "nodes", "partitions", "clients", "seconds", "lock_policy",
    "commits", "commits_per_s", "attempts", "aborted_attempts", "abort_rate", "not_committed", "dist_commits",
    "dist_avg_ms",
    "dist_p50_ms", "dist_p99_ms", "all_avg_ms", "all_p99_ms", "execution_ms", "prepare_ms", "commit_ms",
    "node_total_ms", "node_total_p50_ms", "prepare_p50_ms", "rw_dist_commits", "rw_dist_avg_ms", "rw_commit_path_ms",
    "w_log_once_ms", "w_log_ms",
    "node_cpu_ms", "storage_cpu_ms", "driver_cpu_ms", "driver_cpu_pct", "storage_calls", "peer_messages",
    "cache_hit_pct",
    "kinds", "violations", "errors", "trials", "trial_dist_avg_ms", "trial_commits_per_s",
    # Added 2026-11-28 (after the others, so that readers by position still find theirs).
    "retry_ms", "client_http_ms", "node_cores", "node_idle_cores", "run_commits",
)
# The stacked latency breakdown of distributed transactions, bottom to top: (CSV column, label,
# colour). Their averages add up to dist_avg_ms (summarize computes client/HTTP as the rest).
BREAKDOWN_SEGMENTS = (
    ("execution_ms", "execution", "#9ecae1"),
    ("prepare_ms", "prepare", "#fdae6b"),
    ("commit_ms", "commit", "#e6550d"),
    ("retry_ms", "retries (aborted attempts)", "#bdbdbd"),
    ("client_http_ms", "client/HTTP", "#ffffff"),
)


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def summarize(result: RunResult, param: str = "", value: str = "") -> dict[str, Any]:
    """The row of one measurement (see CSV_FIELDS)."""
    driver = result.driver
    # Latencies from the driver's records (all transactions, or a uniform sample of them past
    # TXN_RECORD_COUNT_MAX); counts from its exact counters.
    measured = [r for r in driver.records if r.started_s >= result.warmup_s]
    window_s = max(driver.wall_s - result.warmup_s, 1e-9)
    committed = [r for r in measured if r.outcome == "committed"]
    distributed = [r for r in committed if r.distributed]
    read_write = [r for r in distributed if not r.read_only]
    attempts = driver.attempted(measured=True)
    aborted = driver.aborted(measured=True)
    commit_count = driver.committed(measured=True)
    kinds = [f"{kind}:{driver.committed(kind=kind, measured=True)}/{driver.attempted(kind=kind, measured=True)}"
             for kind in driver.kinds()]
    settings = result.settings
    return {
        "param": param, "value": value, "protocol": result.protocol, "workload": settings.workload,
        "storage": result.storage, "nodes": settings.nodes, "partitions": settings.partitions,
        "clients": settings.clients, "seconds": settings.seconds, "lock_policy": settings.lock_policy,
        "commits": commit_count, "commits_per_s": round(commit_count / window_s, 1),
        "attempts": attempts, "aborted_attempts": aborted,
        "abort_rate": round(aborted / attempts, 4) if attempts else 0,
        # The most frequent reasons attempts did not commit, over the whole run (warm-up too).
        "not_committed": "; ".join(f"{kind}={count}" for kind, count in driver.not_committed.most_common(6)),
        "dist_commits": driver.committed(measured=True, distributed=True),
        "dist_avg_ms": round(_mean([r.latency_ms for r in distributed]), 3),
        "dist_p50_ms": round(percentile([r.latency_ms for r in distributed], 0.5), 3),
        "dist_p99_ms": round(percentile([r.latency_ms for r in distributed], 0.99), 3),
        "all_avg_ms": round(_mean([r.latency_ms for r in committed]), 3),
        "all_p99_ms": round(percentile([r.latency_ms for r in committed], 0.99), 3),
        "execution_ms": round(_mean([r.timing_ms.get("execution", 0.0) for r in distributed]), 3),
        "prepare_ms": round(_mean([r.timing_ms.get("prepare", 0.0) for r in distributed]), 3),
        "commit_ms": round(_mean([r.timing_ms.get("commit", 0.0) for r in distributed]), 3),
        "retry_ms": round(_mean([r.retry_ms for r in distributed]), 3),
        "client_http_ms": round(_mean([_client_ms(r) for r in distributed]), 3),
        "node_total_ms": round(_mean([r.timing_ms.get("total", 0.0) for r in distributed]), 3),
        # Medians beside the means: issue 10's latency targets are p50s.
        "node_total_p50_ms": round(percentile([r.timing_ms.get("total", 0.0) for r in distributed], 0.5), 3),
        "prepare_p50_ms": round(percentile([r.timing_ms.get("prepare", 0.0) for r in distributed], 0.5), 3),
        "rw_dist_commits": driver.committed(measured=True, distributed=True, read_only=False),
        "rw_dist_avg_ms": round(_mean([r.latency_ms for r in read_write]), 3),
        "rw_commit_path_ms": round(_mean([r.timing_ms.get("prepare", 0.0) + r.timing_ms.get("commit", 0.0)
                                          for r in read_write]), 3),
        "w_log_once_ms": round(result.storage_mean_ms.get("log_once", 0.0), 3),
        "w_log_ms": round(result.storage_mean_ms.get("log", 0.0), 3),
        "node_cpu_ms": "" if result.node_cpu_ms is None else round(result.node_cpu_ms, 3),
        "storage_cpu_ms": "" if result.storage_cpu_ms is None else round(result.storage_cpu_ms, 3),
        "driver_cpu_ms": round(result.client_cpu_ms, 3),
        "driver_cpu_pct": round(100 * driver.measured_cpu_s / window_s, 1) if driver.wall_s else 0,
        "storage_calls": round(sum(result.storage_calls.values()), 2),
        "peer_messages": round(result.peer_messages, 2),
        "cache_hit_pct": "" if result.cache_hit_ratio is None else round(100 * result.cache_hit_ratio, 1),
        "kinds": " ".join(kinds),
        "violations": len(result.violations),
        "errors": len(driver.errors),
        # One trial until median_trial() makes the row stand for several.
        "trials": 1,
        "trial_dist_avg_ms": "",
        "trial_commits_per_s": "",
        "node_cores": "" if result.node_cores is None else round(result.node_cores, 3),
        "node_idle_cores": "" if result.node_idle_cores is None else round(result.node_idle_cores, 3),
        "run_commits": driver.committed(),
    }


def _client_ms(record: TxnRecord) -> float:
    """What the client's latency holds beyond the retries and the node's phases of the last
    attempt: its HTTP calls and the driver's own time. The sum of the phases rather than the node's
    "total" keeps the stacked segments adding up to the latency to the last digit (they are equal
    for a committed transaction)."""
    phases = sum(record.timing_ms.get(phase, 0.0) for phase in ("execution", "prepare", "commit"))
    return record.latency_ms - record.retry_ms - phases


def vote_write_ms(row: dict[str, Any]) -> float:
    """W of a row: the mean vote write at its nodes (Cornus votes with log_once, the others with log)."""
    return float(row["w_log_once_ms"] or row["w_log_ms"] or 0.0)


def median_trial(trials: Sequence[tuple[dict[str, Any], RunResult]]) -> tuple[dict[str, Any], RunResult]:
    """Of several trials of one protocol at one point, the one with the median average latency of
    distributed transactions (the lower of the two middle ones for an even count), as the paper
    kept the median of its five trials. Its row names how many trials there were and every
    trial's average latency and throughput, in the order they ran; a trial that committed no
    distributed transaction counts as the slowest. The invariant violations and workload errors of
    every trial are the kept result's too, so none goes unreported."""
    assert trials, "no trial"
    ranked = sorted(trials, key=lambda trial: (trial[0]["dist_commits"] == 0, trial[0]["dist_avg_ms"]))
    row, result = ranked[(len(ranked) - 1) // 2]
    row = {**row, "trials": len(trials),
           "trial_dist_avg_ms": ";".join(f"{trial_row['dist_avg_ms']:.2f}" for trial_row, _ in trials),
           "trial_commits_per_s": ";".join(f"{trial_row['commits_per_s']:.0f}" for trial_row, _ in trials)}
    others = [(number, other) for number, (_, other) in enumerate(trials, 1) if other is not result]
    result.violations = [*result.violations,
                         *(f"(trial {number}) {violation}" for number, other in others
                           for violation in other.violations),
                         *(f"(trial {number}) program error: {error}" for number, other in others
                           for error in other.driver.errors)]
    row["violations"] = len(result.violations)
    return row, result


def _number(row: dict[str, Any], column: str, digits: int = 2) -> str:
    """A figure of `row`, or n/a where it has none ("" in the row, or a row from before the column)."""
    value = row.get(column, "")
    return "n/a" if value == "" else f"{float(value):.{digits}f}"


# Said under the table and the summary's: what a CPU figure per commit holds.
CPU_LEGEND = ("node CPU ms per commit charges every CPU second of the nodes in the measured window, fixed "
              "background work (lease renewals, identity checks, GC timers) included, so it is comparable across "
              "protocols only at similar throughput; cores: node CPU seconds per wall second in the window, idle: "
              "the same with no clients, after the run")


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """The terminal table: throughput and latency, the breakdown that adds up to the latency, then
    what each committed transaction cost. The point column appears only in a sweep, so a single
    run's lines start with the protocol's name."""
    swept = any(row["param"] for row in rows)
    point_head = f"{'point':<18} " if swept else ""
    lines = [f"{point_head}{'protocol':<16} {'commits/s':>9} {'abort%':>6} {'dist avg':>8} {'dist p99':>8} | "
             f"{'execution':>9} {'prepare':>7} {'commit':>7} {'retries':>7} {'client':>6} | {'W ms':>6} "
             f"{'node CPU':>8} {'cores':>5} {'idle':>5} {'storage CPU':>11} {'driver CPU':>10} "
             f"{'storage':>7} {'peer msg':>8} {'cache':>6}"]
    for row in rows:
        point = f"{row['param']}={row['value']:<{17 - len(row['param'])}} " if swept else ""
        cache = f"{row['cache_hit_pct']}%" if row["cache_hit_pct"] != "" else "n/a"
        lines.append(
            f"{point}{row['protocol']:<16} {row['commits_per_s']:>9.0f} {100 * row['abort_rate']:>6.1f} "
            f"{row['dist_avg_ms']:>8.2f} {row['dist_p99_ms']:>8.2f} | {row['execution_ms']:>9.2f} "
            f"{row['prepare_ms']:>7.2f} {row['commit_ms']:>7.2f} {_number(row, 'retry_ms'):>7} "
            f"{_number(row, 'client_http_ms'):>6} | {vote_write_ms(row):>6.2f} {_number(row, 'node_cpu_ms'):>8} "
            f"{_number(row, 'node_cores'):>5} {_number(row, 'node_idle_cores'):>5} "
            f"{_number(row, 'storage_cpu_ms'):>11} {row['driver_cpu_ms']:>10.2f} {row['storage_calls']:>7.2f} "
            f"{row['peer_messages']:>8.2f} {cache:>6}")
    lines.append("latencies in ms, of committed distributed transactions (client side, retries included); breakdown: "
                 "the coordinator's own timing of the last attempt, then the time lost to earlier attempts (retries) "
                 "and the client's HTTP side (client), adding up to dist avg; W: mean vote write at the nodes "
                 "(log_once, or log for 2PC and coordinator-log); CPU ms, storage calls and peer messages per "
                 "committed transaction, every figure over the measured window (after the warm-up); storage CPU is "
                 "the emulator's writer process (n/a on other backends); driver CPU is this process's; " + CPU_LEGEND)
    return "\n".join(lines)


def _points(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    return list(dict.fromkeys((row["param"], row["value"]) for row in rows))


def ratio_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per sweep point: 2PC/Cornus and coordinator-log/Cornus on average and p99 distributed
    latency and on the commit path, and the limit of 2PC/Cornus's commit path, (r + 2W) / (r + W)
    = 1 + W / P, with P Cornus's commit path, W the mean log_once the Cornus nodes saw and r = P - W
    the rest of that path. r is not a measured round trip (a one-shot has none on that path) and
    may be negative where P is shorter than the mean log_once; the limit stays 1 + W / P then.
    Beside W: 2PC's own mean log write (its votes and decisions, which its counters do not tell
    apart), to show whether a miss of the limit is 2PC's writes being slower than Cornus's."""
    out = []
    for param, value in _points(rows):
        at = {row["protocol"]: row for row in rows if (row["param"], row["value"]) == (param, value)}
        cornus = at.get("cornus")
        if cornus is None or not cornus["dist_commits"]:
            continue
        entry: dict[str, Any] = {"param": param, "value": value}
        for other, name in (("2pc", "2pc"), ("coordinator-log", "clog")):
            row = at.get(other)
            if row is None or not row["dist_commits"]:
                continue
            entry[f"{name}_avg"] = _ratio(row["dist_avg_ms"], cornus["dist_avg_ms"])
            entry[f"{name}_node_avg"] = _ratio(row["node_total_ms"], cornus["node_total_ms"])
            entry[f"{name}_p99"] = _ratio(row["dist_p99_ms"], cornus["dist_p99_ms"])
            entry[f"{name}_rw_avg"] = _ratio(row["rw_dist_avg_ms"], cornus["rw_dist_avg_ms"])
            entry[f"{name}_commit_path"] = _ratio(row["rw_commit_path_ms"], cornus["rw_commit_path_ms"])
        w = cornus["w_log_once_ms"]
        path = cornus["rw_commit_path_ms"]
        if w and path and "2pc_commit_path" in entry:
            entry["w_ms"] = w
            entry["rest_ms"] = round(path - w, 3)
            entry["w_2pc_ms"] = at["2pc"]["w_log_ms"]
            entry["limit"] = round(1 + w / path, 3)
            entry["of_limit_pct"] = round(100 * entry["2pc_commit_path"] / entry["limit"], 1)
        out.append(entry)
    return out


def _ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else 0.0


def markdown_summary(rows: Sequence[dict[str, Any]], *, title: str, command: str, machine: str,
                     violations: Sequence[str], files: Sequence[str]) -> str:
    lines = [f"# {title}", "", f"Command: `{command}`", "", f"Machine: {machine}", ""]
    lines += ["| point | protocol | commits/s | abort % | dist avg ms | dist p99 ms | execution | prepare | commit "
              "| retries | client/HTTP | W ms | node CPU ms/txn | node cores | idle cores | driver CPU % |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        point = f"{row['param']}={row['value']}" if row["param"] else "-"
        lines.append(f"| {point} | {row['protocol']} | {row['commits_per_s']:.0f} | {100 * row['abort_rate']:.1f} "
                     f"| {row['dist_avg_ms']:.2f} | {row['dist_p99_ms']:.2f} | {row['execution_ms']:.2f} "
                     f"| {row['prepare_ms']:.2f} | {row['commit_ms']:.2f} | {_number(row, 'retry_ms')} "
                     f"| {_number(row, 'client_http_ms')} | {vote_write_ms(row):.2f} "
                     f"| {row['node_cpu_ms']} | {_number(row, 'node_cores')} | {_number(row, 'node_idle_cores')} "
                     f"| {row['driver_cpu_pct']} |")
    lines += ["", "Every figure is over the measured window (after the warm-up). The breakdown adds up to dist avg: "
              "the coordinator's own timing of the last attempt (execution, prepare, commit), the time lost to the "
              "attempts before it (retries) and the client's HTTP side (client/HTTP). "
              + CPU_LEGEND[0].upper() + CPU_LEGEND[1:] + "."]
    lines += _trial_lines(rows)
    ratios = ratio_rows(rows)
    if ratios:
        lines += ["", "Latency ratios over Cornus (distributed transactions; commit path: prepare + commit of the "
                  "ones that wrote; limit: (r + 2W) / (r + W) = 1 + W / P with P Cornus's commit path, W the mean "
                  "log_once at the Cornus nodes and r = P - W the rest of Cornus's commit path, not a measured "
                  "round trip; 2PC W: 2PC's own mean log write, votes and decisions alike):", "",
                  "| point | 2PC/Cornus avg | at the coordinator | 2PC/Cornus p99 | 2PC/Cornus commit path | limit "
                  "| % of limit | W ms | r ms | 2PC W ms | coord-log/Cornus avg | coord-log/Cornus p99 "
                  "| coord-log/Cornus commit path |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for entry in ratios:
            point = f"{entry['param']}={entry['value']}" if entry["param"] else "-"
            lines.append(f"| {point} | {entry.get('2pc_avg', '')} | {entry.get('2pc_node_avg', '')} "
                         f"| {entry.get('2pc_p99', '')} "
                         f"| {entry.get('2pc_commit_path', '')} | {entry.get('limit', '')} "
                         f"| {entry.get('of_limit_pct', '')} | {entry.get('w_ms', '')} | {entry.get('rest_ms', '')} "
                         f"| {entry.get('w_2pc_ms', '')} | {entry.get('clog_avg', '')} "
                         f"| {entry.get('clog_p99', '')} | {entry.get('clog_commit_path', '')} |")
    lines += _missing_ratios(rows)
    kinds = [row for row in rows if " " in row["kinds"] or row["workload"] == "bank"]
    if kinds:
        lines += ["", "Commits / attempts by transaction kind (transactions started in the measured window):", ""]
        lines += [f"- {row['param']}={row['value']} {row['protocol']}: {row['kinds']}" if row["param"]
                  else f"- {row['protocol']}: {row['kinds']}" for row in kinds]
    lines += ["", "Invariant checks: " + ("all passed" if not violations else f"{len(violations)} violations")]
    lines += [f"- {violation}" for violation in violations[:20]]
    if files:
        lines += ["", "Files: " + ", ".join(f"`{name}`" for name in files)]
    return "\n".join(lines) + "\n"


def _trial_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Under the table, when rows stand for several trials: which trial each is, and the spread."""
    several = [row for row in rows if int(row.get("trials") or 1) > 1]
    if not several:
        return []
    lines = ["", f"Each row is the trial with the median dist avg of {several[0]['trials']} trials (the protocols "
             "alternated, trial by trial); every trial's dist avg ms and commits/s, in the order they ran:", ""]
    for row in several:
        point = f"{row['param']}={row['value']} " if row["param"] else ""
        lines.append(f"- {point}{row['protocol']}: {row['trial_dist_avg_ms'].replace(';', ', ')} ms; "
                     f"{row['trial_commits_per_s'].replace(';', ', ')} commits/s")
    return lines


def _missing_ratios(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Said, not left out: the ratios a point cannot have because a protocol committed no
    distributed transaction in its measured window (a slow backend under load, a short run)."""
    lines = []
    names = {"2pc": "2PC/Cornus", "coordinator-log": "coordinator-log/Cornus"}
    for param, value in _points(rows):
        at = {row["protocol"]: row for row in rows if (row["param"], row["value"]) == (param, value)}
        point = f"{param}={value}: " if param else ""
        for other, name in names.items():
            if other not in at or "cornus" not in at:
                continue
            idle = [protocol for protocol in ("cornus", other) if not at[protocol]["dist_commits"]]
            if idle:
                lines.append(f"- {point}{name} n/a: {' and '.join(idle)} committed no distributed transaction "
                             f"in the measured window")
    return ["", *lines] if lines else []


def format_ratios(rows: Sequence[dict[str, Any]]) -> str:
    """The ratio lines printed under the table."""
    lines = []
    for entry in ratio_rows(rows):
        point = f"{entry['param']}={entry['value']}: " if entry["param"] else ""
        parts = []
        if "2pc_avg" in entry:
            parts.append(f"2PC/Cornus avg {entry['2pc_avg']:.2f}x (at the coordinator {entry['2pc_node_avg']:.2f}x), "
                         f"p99 {entry['2pc_p99']:.2f}x, commit path {entry['2pc_commit_path']:.2f}x")
            if "limit" in entry:
                parts[-1] += (f" (limit (r+2W)/(r+W) = {entry['limit']:.2f} with W (Cornus's mean log_once) "
                              f"{entry['w_ms']:.2f} ms, r (the rest of Cornus's commit path) "
                              f"{entry['rest_ms']:.2f} ms, 2PC's mean log write "
                              f"{float(entry['w_2pc_ms'] or 0):.2f} ms: {entry['of_limit_pct']:.0f}% of it)")
        if "clog_avg" in entry:
            parts.append(f"coordinator-log/Cornus avg {entry['clog_avg']:.2f}x, p99 {entry['clog_p99']:.2f}x, "
                         f"commit path {entry['clog_commit_path']:.2f}x")
        if parts:
            lines.append(point + "; ".join(parts))
    return "\n".join(lines)
