"""Run the chaos suite and print the figures table of ``docs/reliability.md``.

Each scenario appends one JSON line of figures per run to ``$PG_CHAOS_REPORT``
(see :mod:`tests.chaos.scenario`); this script runs pytest with that set and
renders the lines as a Markdown table, one row per scenario and backend.

    python -m tests.chaos.report                 # the whole suite, all backends
    python -m tests.chaos.report -k sqlite       # extra arguments go to pytest
    python -m tests.chaos.report --from runs.jsonl   # only render earlier figures
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BACKEND_ORDER = {"sqlite": 0, "etcd": 1, "zk": 2}


def _order(scenario: str) -> tuple[int, str]:
    """Scenarios by their number in the issue ("10a ..." after "9 ...")."""
    head = scenario.split(" ", 1)[0]
    digits = "".join(c for c in head if c.isdigit())
    return (int(digits) if digits else 99, scenario)


def render(lines: list[dict[str, Any]]) -> str:
    from tests.chaos.scenario import NOT_APPLICABLE

    rows: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for line in lines:
        rows[(line["scenario"], line["backend"])].append(line)
    scenarios = {scenario for scenario, _ in rows}
    for key in NOT_APPLICABLE:
        if key[0] in scenarios:
            rows.setdefault(key, [])
    out = [
        "| scenario | backend | runs | faults | rows written | rows lost | duplicates "
        "| rejected stale commits | recovery median (s) | recovery max (s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (scenario, backend), runs in sorted(
            rows.items(), key=lambda kv: (_order(kv[0][0]), BACKEND_ORDER.get(kv[0][1], 9))):
        if not runs:
            out.append(f"| {scenario} | {backend} | n/a: {NOT_APPLICABLE[(scenario, backend)]} "
                       "| | | | | | | |")
            continue
        rec = [r for run in runs for r in run["recoveries"]]
        median = f"{statistics.median(rec):.2f}" if rec else "-"
        worst = f"{max(rec):.2f}" if rec else "-"
        out.append(
            f"| {scenario} | {backend} | {len(runs)} | {sum(r['faults'] for r in runs)} "
            f"| {sum(r['rows_written'] for r in runs)} | {sum(r['rows_lost'] for r in runs)} "
            f"| {sum(r['duplicates'] for r in runs)} "
            f"| {sum(r['rejected_commits'] for r in runs)} | {median} | {worst} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.report")
    parser.add_argument("--from", dest="source", type=Path,
                        help="render figures from this JSONL file instead of running")
    parser.add_argument("--keep", type=Path, help="also keep the raw JSONL figures here")
    args, pytest_args = parser.parse_known_args(argv)
    code = 0
    if args.source is not None:
        path = args.source
    else:
        fd, name = tempfile.mkstemp(prefix="chaos-", suffix=".jsonl")
        os.close(fd)
        path = Path(name)
        env = {**os.environ, "PG_CHAOS_REPORT": str(path)}
        code = subprocess.call(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "chaos",
             "tests/chaos", *pytest_args], cwd=REPO, env=env)
        if args.keep is not None:
            args.keep.write_text(path.read_text())
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    print(render(lines))
    if code != 0:
        print(f"\npytest exited {code}: some scenarios failed (their figures are missing above)")
    return code


if __name__ == "__main__":
    sys.exit(main())
