"""Rich tables for people (``describe`` without ``--json``).

Example::

    render_describe({"group": "g", "members": [], "shards": [], "generation": 0,
                     "leader": None, "latest_snapshot": None, "state": "empty"})
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from rich.console import Console, Group
from rich.table import Table


def _ago(ts: float | None) -> str:
    if not ts:
        return "-"
    delta = dt.datetime.now(dt.UTC).timestamp() - ts
    return f"{delta:.0f}s ago" if delta < 3600 else f"{delta / 3600:.1f}h ago"


def describe_renderable(report: dict[str, Any]) -> Group:
    head = (
        f"[bold]group[/bold] {report['group']}  [bold]state[/bold] {report.get('state')}  "
        f"[bold]generation[/bold] {report.get('generation')}  "
        f"[bold]leader[/bold] {report.get('leader') or '-'}  "
        f"[bold]latest snapshot[/bold] {report.get('latest_snapshot')}  "
        f"[bold]total lag[/bold] {report.get('total_lag_snapshots', 0)}"
    )
    members = Table(title="members", title_justify="left")
    for col in ("member", "host", "pid", "version", "shards"):
        members.add_column(col)
    for m in report.get("members", []):
        members.add_row(m["member_id"], str(m.get("host", "")), str(m.get("pid", "")),
                        str(m.get("version", "")),
                        ",".join(str(s) for s in m.get("owned_shards", [])) or "-")
    shards = Table(title="shards", title_justify="left")
    for col in ("shard", "owner", "epoch", "next snapshot", "lag", "last commit"):
        shards.add_column(col, justify="right" if col != "owner" else "left")
    for s in report.get("shards", []):
        shards.add_row(
            str(s["shard"]), s["owner"] or "[red]-[/red]", str(s["epoch"] or "-"),
            str(s["next_snapshot"] or "-"),
            "-" if s["lag_snapshots"] is None else str(s["lag_snapshots"]),
            _ago(s.get("last_commit")),
        )
    return Group(head, members, shards)


def render_describe(report: dict[str, Any], console: Console | None = None) -> None:
    (console or Console()).print(describe_renderable(report))
