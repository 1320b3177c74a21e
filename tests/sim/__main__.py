"""The seeded fault simulation from the command line.

    python -m tests.sim --seeds 20000 --jobs 2      # seeds 0..19999
    python -m tests.sim --seeds 1000 --first 50000  # seeds 50000..50999
    python -m tests.sim --seed 1234 -v              # one seed, with the member's log
    python -m tests.sim --seeds 2000 --profile heavy  # 10-30 % faulty calls, static members
    PG_SIM_DUMP=1 python -m tests.sim --seed 1234     # and each store's positions, the deliveries

Runs under ``PYTHONHASHSEED=0`` (it re-executes itself with it when it is not
set), so a seed reproduces exactly. Exit status 1 when a seed has a violation;
each failing seed is printed with the command that reruns it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys


def _one(seed: int, verbose: bool, plant: str | None) -> int:
    from tests.sim.loop import WALL_EPOCH
    from tests.sim.scenario import rerun_command, run_seed

    level = logging.CRITICAL
    if verbose:
        class Virtual(logging.Formatter):
            def format(self, r: logging.LogRecord) -> str:
                who = getattr(r, "member", "-")
                return f"{r.created - WALL_EPOCH - 1000:9.3f} {who:4} {r.getMessage()}"

        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(Virtual())
        logging.getLogger().addHandler(handler)
        level = logging.INFO
    result = run_seed(seed, plant=plant, log_level=level)
    print(result.summary())
    print(f"faults: {json.dumps(dict(sorted(result.faults.items())))}")
    print(f"trace {result.trace}, {result.virtual_s:.1f} s simulated, "
          f"{result.wall_s:.2f} s wall")
    if not result.ok:
        print(f"rerun: {rerun_command(seed)}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=500, help="how many seeds (default 500)")
    parser.add_argument("--first", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--seed", type=int, help="run this one seed only")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="worker processes (default: 2, or 1 on one CPU)")
    parser.add_argument("--plant", help="a planted fault (tests only): stale_fence, "
                        "drop_delivery")
    parser.add_argument("--profile", choices=("default", "heavy"), default=None,
                        help="heavy: 10-30 %% of the calls faulty, static membership in half "
                        "the seeds (default: PG_SIM_PROFILE, else default)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="with --seed: the members' log, on virtual time")
    args = parser.parse_args(argv)
    if args.profile is not None:
        os.environ["PG_SIM_PROFILE"] = args.profile  # read by the workers too
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "tests.sim", *sys.argv[1:]])
    if args.seed is not None:
        return _one(args.seed, args.verbose, args.plant)

    from tests.sim.runner import run_many

    def progress(summary: object) -> None:
        print(summary.report().splitlines()[0], flush=True)  # type: ignore[attr-defined]

    def failed(result: object) -> None:
        print(f"FAILED seed {result.seed}: {result.summary()[:2000]}", flush=True)  # type: ignore[attr-defined]

    summary = run_many(range(args.first, args.first + args.seeds), jobs=args.jobs,
                       plant=args.plant, progress=progress, on_failure=failed)
    print(summary.report())
    return 1 if summary.failed else 0


if __name__ == "__main__":
    sys.exit(main())
