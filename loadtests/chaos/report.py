"""The summary as a plain-text table (the JSON form is the summary dict itself)."""

from __future__ import annotations

import json
from typing import Any

from loadtests.chaos.faults import FAULT_KINDS
from loadtests.chaos.workloads import RESULTS

EXAMPLES_SHOWN = 3
WHYS_SHOWN = 5
EXAMPLE_CHARS_MAX = 400


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(header, widths, strict=True)).rstrip()]
    lines += ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
              for row in rows]
    return lines


def format_summary(summary: dict[str, Any]) -> str:
    config = summary.get("config", {})
    lines = [
        f"cornus chaos run: backend={config.get('backend')} nodes={config.get('nodes')} "
        f"partitions={config.get('partitions')} protocol={config.get('protocol')} seed={config.get('seed')} "
        f"faults for {config.get('duration_s')} s",
        f"storage link faults: {summary.get('storage_faults', '-')}",
        f"logs: {summary.get('workdir')}",
    ]
    storage = summary.get("storage")
    if storage:
        # Azure Blob and DynamoDB runs each have a container or table of their own: name it, so the
        # records can be looked at (with --keep-storage) or the leftover deleted by hand.
        where = ", ".join(f"{kind} {storage[kind]}" for kind in ("container", "table") if kind in storage)
        fate = "kept" if storage.get("kept") else "deleted at the end"
        if storage.get("delete_error"):
            fate = f"NOT deleted ({storage['delete_error']})"
        lines.insert(2, f"storage: {storage.get('backend')} {where}, {fate}")
    timings = summary.get("timings", {})
    if timings:
        lines.append("timings: " + ", ".join(f"{name} {value} s" for name, value in timings.items()))
    if summary.get("error"):
        lines += ["", f"RUN ERROR: {summary['error']}"]
    for anomaly in summary.get("harness_anomalies", [])[:EXAMPLES_SHOWN * 3]:
        lines.append(f"HARNESS ANOMALY: {anomaly}")
    injected = summary.get("faults_injected")
    if injected is not None:
        scheduled: dict[str, int] = {}
        for fault in summary.get("schedule", []):
            scheduled[fault["kind"]] = scheduled.get(fault["kind"], 0) + 1
        rows = [[kind, str(scheduled.get(kind, 0)), str(injected.get(kind, 0))] for kind in FAULT_KINDS]
        rows.append(["total", str(sum(scheduled.values())), str(sum(injected.values()))])
        lines += ["", "FAULTS", *_table(["kind", "scheduled", "injected"], rows)]
        for error in summary.get("fault_errors", [])[:EXAMPLES_SHOWN]:
            lines.append(f"  fault error: {error}")
    workloads = summary.get("workloads")
    if workloads:
        rows = [[name, str(tally["attempted"]), *(str(tally[result]) for result in RESULTS)]
                for name, tally in workloads.items()]
        lines += ["", "WORKLOADS", *_table(["workload", "attempted", *RESULTS], rows)]
        for name, tally in workloads.items():
            whys = [f"{why} {count}" for why, count in tally.get("why", {}).items() if not why.startswith("committed")]
            if whys:
                lines.append(f"  {name} not committed, why: {', '.join(whys[:WHYS_SHOWN])}")
        for error in summary.get("workload_errors", [])[:EXAMPLES_SHOWN]:
            lines.append(f"  client error: {error}")
    results = summary.get("checks")
    if results:
        rows = [[f"({c['key']}) {c['name']}", str(c["violations"]), c["status"]] for c in results]
        lines += ["", "CHECKS", *_table(["check", "violations", "result"], rows)]
        for check in results:
            for note in check["notes"]:
                lines.append(f"  ({check['key']}) {note}")
            for example in check["examples"][:EXAMPLES_SHOWN]:
                text = json.dumps(example, sort_keys=True)
                if len(text) > EXAMPLE_CHARS_MAX:
                    text = text[:EXAMPLE_CHARS_MAX] + "..."
                lines.append(f"  ({check['key']}) violation: {text}")
            if len(check["examples"]) > EXAMPLES_SHOWN:
                more = len(check["examples"]) - EXAMPLES_SHOWN
                lines.append(f"  ({check['key']}) ... {more} more examples in the JSON")
    lines += ["", "RESULT: " + ("PASS" if summary.get("passed") else "FAIL")]
    return "\n".join(lines)
