"""Run every benchmark, print one table, write JSON to ``bench-results/``.

    python -m tests.benchmarks.run                 # all of them
    python -m tests.benchmarks.run handoff latency # only these (by TITLE or module)
    python -m tests.benchmarks.run --quick         # smaller sizes

A benchmark is a module ``tests/benchmarks/bench_*.py`` with ``TITLE`` and
``run(ctx: Context) -> list[Figure]``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.common import Context, Figure

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def discover() -> list[Any]:
    modules = []
    for path in sorted(HERE.glob("bench_*.py")):
        module = importlib.import_module(f"tests.benchmarks.{path.stem}")
        if hasattr(module, "run"):
            if not hasattr(module, "TITLE"):
                module.TITLE = path.stem.removeprefix("bench_")
            modules.append(module)
    order = ["throughput", "metadata", "handoff", "failover", "latency", "coordinator",
             "memory", "append", "paimon-sink"]
    return sorted(modules, key=lambda m: order.index(m.TITLE) if m.TITLE in order else 99)


def machine() -> dict[str, Any]:
    import psutil

    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_avg_at_start": os.getloadavg(),
    }


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "x":
        return f"{value:.2f}x"
    return f"{value:,.1f} {unit}" if isinstance(value, float) else f"{value:,} {unit}"


def print_table(figures: list[Figure], elapsed: dict[str, float]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="paimon-group benchmarks")
    for col in ("benchmark", "figure", "value", "target", "met"):
        table.add_column(col)
    for f in figures:
        met = "-" if f.met is None else ("yes" if f.met else "[red]NO[/red]")
        table.add_row(f.bench, f.name, fmt(f.value, f.unit), f.target or "", met)
    Console().print(table)
    Console().print("seconds per benchmark: " + ", ".join(
        f"{k} {v:.0f}" for k, v in elapsed.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.run")
    parser.add_argument("only", nargs="*", help="benchmark titles or module names")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    parser.add_argument("--out", default=str(REPO / "bench-results"))
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args(argv)

    modules = [m for m in discover()
               if not args.only or m.TITLE in args.only or m.__name__.split(".")[-1] in args.only
               or m.__name__.split(".")[-1].removeprefix("bench_") in args.only]
    workdir = Path(tempfile.mkdtemp(prefix="pg-bench-"))
    ctx = Context(workdir=workdir, quick=args.quick)
    figures: list[Figure] = []
    errors: dict[str, str] = {}
    elapsed: dict[str, float] = {}
    info = machine()
    try:
        for module in modules:
            began = time.monotonic()
            print(f"== {module.TITLE} ...", flush=True)
            try:
                got = module.run(ctx)
                figures.extend(got)
                for f in got:
                    print(f"   {f.name}: {fmt(f.value, f.unit)}", flush=True)
            except Exception:
                errors[module.TITLE] = traceback.format_exc()
                print(errors[module.TITLE], file=sys.stderr, flush=True)
                figures.append(Figure(module.TITLE, "FAILED (see errors in JSON)", None, "",
                                      met=False))
            elapsed[module.TITLE] = time.monotonic() - began
    finally:
        ctx.close()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print_table(figures, elapsed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = out / f"bench-{stamp}.json"
    path.write_text(json.dumps({
        "machine": info, "quick": args.quick, "seconds": elapsed,
        "figures": [f.as_dict() for f in figures], "errors": errors,
    }, indent=2, default=str))
    print(f"results: {path}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
