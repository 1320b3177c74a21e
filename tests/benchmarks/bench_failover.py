"""(4) Crash failover: SIGKILL of a member -> each of its shards delivering
again from the survivor, against the session timeout; embedded and etcd.

Two real ``paimon-group run`` processes (16 shards, poll 100 ms), a writer
committing every 100 ms. For every shard the killed member owned: the time
from the SIGKILL (taken in this process just before the signal,
CLOCK_MONOTONIC) to the survivor's ``acquire`` and to its first ``deliver``
(handler returned) of that shard, from the ``--history`` files.

At two session timeouts: the members' default (10 s), which the target
(<= 1.1x, issue 24) is judged at, and 2 s, printed beside it: there a fixed
part weighs five times as much (on etcd the lease's whole seconds and the
lessor's 500 ms tick, docs/benchmarks.md (4)).
"""

from __future__ import annotations

import time

from tests.benchmarks.common import Context, Figure, distribution, ms
from tests.benchmarks.procs import SESSION_TIMEOUT_S, BenchGroup

TITLE = "failover"


DEFAULT_SESSION_TIMEOUT_S = 10.0  # MemberConfig's default


def measure(ctx: Context, backend: str, trials: int, timeout_s: float
            ) -> tuple[list[float], list[float]]:
    base = ctx.scratch(f"failover-{backend}")
    coord = ctx.etcd_url() if backend == "etcd" else f"sqlite://{base}/coord.sqlite"
    g = BenchGroup(base, coord, session_timeout_s=timeout_s)
    acquired: list[float] = []
    delivering: list[float] = []
    try:
        g.start_writer()
        g.h.start("m0")
        g.h.start("m1")
        for _ in range(trials):
            d = g.wait_stable({"m0", "m1"})
            victim = [s for s, m in g.owners(d).items() if m == "m1"]
            time.sleep(0.5)  # both members delivering
            killed_at = time.monotonic()
            g.h.kill("m1")
            g.wait_stable({"m0"})
            time.sleep(0.5)
            events = g.events()
            for shard in victim:
                acq = next((e["t"] for e in events if e["t"] > killed_at
                            and e["event"] == "acquire" and e["shard"] == shard
                            and e["member"] == "m0"), None)
                dlv = next((e["t"] for e in events if e["t"] > killed_at
                            and e["event"] == "deliver" and e["shard"] == shard
                            and e["member"] == "m0"), None)
                if acq is not None:
                    acquired.append(acq - killed_at)
                if dlv is not None:
                    delivering.append(dlv - killed_at)
            g.h.start("m1")
        return acquired, delivering
    finally:
        g.close()


def run(ctx: Context) -> list[Figure]:
    trials = 1 if ctx.quick else 2
    figures = []
    for timeout_s in (DEFAULT_SESSION_TIMEOUT_S, SESSION_TIMEOUT_S):
        budget = timeout_s * 1.1  # issue 24 (was the session timeout + 0.5 s)
        judged = timeout_s == DEFAULT_SESSION_TIMEOUT_S
        for backend in ("embedded", "etcd"):
            acquired, delivering = measure(ctx, backend, trials, timeout_s)
            da, dd = distribution(acquired), distribution(delivering)
            worst = dd.get("max", float("nan"))
            details = {
                "session_timeout_s": timeout_s,
                "to_acquire_ms": {k: (ms(v) if k != "n" else v) for k, v in da.items()},
                "to_deliver_ms": {k: (ms(v) if k != "n" else v) for k, v in dd.items()},
            }
            figures.append(Figure(
                TITLE, f"{backend}, session timeout {timeout_s:g} s: SIGKILL -> delivering "
                f"again, worst of n={dd['n']} shards / session timeout",
                round(worst / timeout_s, 2), "x",
                target=f"<= 1.10x ({budget:.1f} s)" if judged else None,
                met=worst <= budget if judged else None,
                details={**details, "note": f"worst {worst:.2f} s, median "
                         f"{dd.get('median', float('nan')):.2f} s"}))
    return figures
