"""Runs many seeds in worker processes and sums them up.

Workers are started fresh (``spawn``) with ``PYTHONHASHSEED=0``, so a seed
gives the same run in a worker, in the rerun command and in a test. Each
worker builds its two template tables once (:func:`tests.sim.table.templates`)
and then runs one seed after another.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from tests.sim.scenario import SeedResult, rerun_command, run_seed


def _worker_init() -> None:
    import logging
    import threading

    logging.disable(logging.CRITICAL)
    # A worker ends with the run that started it: killed alone, a run's
    # parent would leave its workers running seeds nobody reads (and taking
    # the machine's cores) until they finish their whole share.
    parent = os.getppid()

    def watch() -> None:
        stop = threading.Event()
        while not stop.wait(1.0):
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="pg-sim-parent", daemon=True).start()


def _run(args: tuple[int, str | None]) -> SeedResult:
    seed, plant = args
    return run_seed(seed, plant=plant)


@dataclass
class Summary:
    seeds: int = 0
    failed: list[SeedResult] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)
    wall_s: float = 0.0
    virtual_s: float = 0.0
    slowest: tuple[float, int] = (0.0, -1)

    def add(self, r: SeedResult) -> None:
        self.seeds += 1
        self.faults.update(r.faults)
        for k, v in r.stats.items():
            if isinstance(v, int) and not isinstance(v, bool) and k not in (
                    "shards", "incarnations", "deliveries", "shards_per_commit",
                    "torn_writes"):
                self.events[k] += v
        self.events[f"table_{r.stats.get('table')}_seeds"] += 1
        self.events[f"kind_{r.stats.get('kind')}_seeds"] += 1
        self.events[f"sink_{r.stats.get('sink')}_seeds"] += 1
        self.events[f"commits_of_{r.stats.get('shards_per_commit')}_shards_seeds"] += 1
        self.events[f"expiry_{r.stats.get('expiry')}_{r.stats.get('on_data_loss')}_seeds"] += 1
        self.virtual_s += r.virtual_s
        self.slowest = max(self.slowest, (r.wall_s, r.seed))
        if not r.ok:
            self.failed.append(r)

    def report(self) -> str:
        rate = self.seeds / self.wall_s if self.wall_s else 0.0
        lines = [
            f"{self.seeds} seeds, {len(self.failed)} with violations, "
            f"{self.wall_s:.1f} s wall ({rate:.1f} seeds/s), "
            f"{self.virtual_s / 3600:.1f} h simulated; slowest seed {self.slowest[1]} "
            f"({self.slowest[0]:.2f} s)",
            f"faults injected: {sum(self.faults.values())} "
            + ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())),
            "events: " + ", ".join(f"{k} {v}" for k, v in sorted(self.events.items())),
        ]
        for r in sorted(self.failed, key=lambda r: r.seed)[:20]:
            lines.append(f"FAILED seed {r.seed}: {r.summary()[:2000]}")
            lines.append(f"  rerun: {rerun_command(r.seed)}")
        return "\n".join(lines)


def run_many(seeds: Iterable[int], *, jobs: int = 2, plant: str | None = None,
             progress: Callable[[Summary], None] | None = None,
             progress_every: int = 500,
             on_failure: Callable[[SeedResult], None] | None = None) -> Summary:
    """Run ``seeds`` on ``jobs`` fresh processes with ``PYTHONHASHSEED=0``."""
    seeds = list(seeds)
    summary = Summary()
    started = time.perf_counter()
    saved = os.environ.get("PYTHONHASHSEED")
    os.environ["PYTHONHASHSEED"] = "0"  # read by each spawned worker at its start
    try:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=context,
                                 initializer=_worker_init) as pool:
            chunk = max(1, min(20, len(seeds) // (4 * max(1, jobs)) or 1))
            for result in pool.map(_run, [(s, plant) for s in seeds], chunksize=chunk):
                summary.add(result)
                if not result.ok and on_failure is not None:
                    on_failure(result)
                summary.wall_s = time.perf_counter() - started
                if progress is not None and summary.seeds % progress_every == 0:
                    progress(summary)
    finally:
        if saved is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = saved
    summary.wall_s = time.perf_counter() - started
    return summary


def results(seeds: Iterable[int], *, jobs: int = 2, plant: str | None = None
            ) -> list[SeedResult]:
    """Every seed's result (for tests that look at more than the sum)."""
    out: list[SeedResult] = []
    saved = os.environ.get("PYTHONHASHSEED")
    os.environ["PYTHONHASHSEED"] = "0"
    try:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=context,
                                 initializer=_worker_init) as pool:
            out.extend(pool.map(_run, [(s, plant) for s in seeds]))
    finally:
        if saved is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = saved
    return out

