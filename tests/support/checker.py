"""Checks a group's delivery history against what was written.

Inputs: the ids written, the deliveries recorded by
:func:`tests.support.handlers.record`, and the members' ``--history`` files
(acquire / release / deliver / commit events with CLOCK_MONOTONIC times,
comparable across the processes of one host).

Each check returns a list of violations (empty = passed), so tests can show
all of them at once and the checker itself can be tested with planted faults.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def read_jsonl(paths: Iterable[Path]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in paths:
        for line in p.read_text().splitlines():
            if line.strip():
                out.append(json.loads(line))
    return out


@dataclass
class History:
    deliveries: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, out_dir: Path) -> History:
        return cls(
            deliveries=read_jsonl(sorted(out_dir.glob("deliveries-*.jsonl"))),
            events=sorted(read_jsonl(sorted(out_dir.glob("history-*.jsonl"))),
                          key=lambda e: e["t"]),
        )

    def commits(self, outcome: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == "commit"
                and (outcome is None or e["outcome"] == outcome)]

    def delivered_counts(self) -> Counter[int]:
        c: Counter[int] = Counter()
        for d in self.deliveries:
            c.update(d["ids"])
        return c


def lost_rows(written: set[int], history: History) -> list[str]:
    missing = written - set(history.delivered_counts())
    return [f"{len(missing)} rows never delivered, e.g. {sorted(missing)[:10]}"] if missing else []


def wrong_shard(history: History, bucket_of: Callable[[int], int], num_shards: int) -> list[str]:
    bad = []
    for d in history.deliveries:
        for i in d["ids"]:
            if bucket_of(i) % num_shards != d["shard"]:
                bad.append(f"id {i} (bucket {bucket_of(i)}) delivered by shard {d['shard']}")
    return bad[:20]


def positions_regressed(history: History) -> list[str]:
    last: dict[int, int] = {}
    bad = []
    for c in history.commits("accepted"):
        shard, n = c["shard"], c["next_snapshot"]
        if shard in last and n < last[shard]:
            bad.append(f"shard {shard}: position moved back {last[shard]} -> {n} "
                       f"(member {c['member']}, epoch {c['epoch']})")
        last[shard] = max(n, last.get(shard, n))
    return bad


def epochs_not_increasing(history: History) -> list[str]:
    last: dict[int, int] = {}
    bad = []
    for e in history.events:
        if e["event"] != "acquire":
            continue
        shard, epoch = e["shard"], e["epoch"]
        if shard in last and epoch <= last[shard]:
            bad.append(f"shard {shard}: epoch {epoch} after {last[shard]}")
        last[shard] = epoch
    return bad


def stale_commits_accepted(history: History) -> list[str]:
    """No commit accepted with an epoch older than the shard's newest acquire."""
    newest: dict[int, int] = {}
    bad = []
    for e in history.events:
        if e["event"] == "acquire":
            newest[e["shard"]] = max(e["epoch"], newest.get(e["shard"], 0))
        elif e["event"] == "commit" and e["outcome"] == "accepted":
            if e["epoch"] < newest.get(e["shard"], 0):
                bad.append(f"shard {e['shard']}: commit of stale epoch {e['epoch']} accepted "
                           f"from {e['member']} after epoch {newest[e['shard']]}")
    return bad


def unexplained_duplicates(history: History) -> list[str]:
    """A row delivered twice must come from a batch whose commit was not accepted."""
    accepted = {(c["member"], c["shard"], c["epoch"], c["next_snapshot"])
                for c in history.commits("accepted")}
    committed_ids: Counter[int] = Counter()
    for d in history.deliveries:
        if (d["member"], d["shard"], d["epoch"], d["next_snapshot"]) in accepted:
            committed_ids.update(set(d["ids"]))
    dup = [i for i, n in committed_ids.items() if n > 1]
    return [f"{len(dup)} rows delivered by two committed batches, e.g. {sorted(dup)[:10]}"] \
        if dup else []


def duplicates(history: History) -> int:
    return sum(n - 1 for n in history.delivered_counts().values() if n > 1)


def check_all(written: set[int], history: History, bucket_of: Callable[[int], int],
              num_shards: int) -> dict[str, list[str]]:
    return {
        "lost": lost_rows(written, history),
        "wrong_shard": wrong_shard(history, bucket_of, num_shards),
        "positions_regressed": positions_regressed(history),
        "epochs_not_increasing": epochs_not_increasing(history),
        "stale_commit_accepted": stale_commits_accepted(history),
        "unexplained_duplicates": unexplained_duplicates(history),
    }


def by_member(history: History) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in history.events:
        out[e["member"]].append(e)
    return out
