"""Rich tables for people: ``describe``, ``list`` and the ``reset`` plan.

Each draws the JSON document that the command's ``--json`` prints (for
``describe``, :meth:`GroupReport.to_dict <paimon_group.ops.report.GroupReport.to_dict>`),
so a person sees what a script reads. Scripts use ``--json``; nothing here is
meant to be parsed.

Example::

    render_describe({"group": "g", "members": [], "shards": [], "generation": 0,
                     "leader": None, "latest_snapshot": None, "state": "empty"})
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

WIDE_COLUMNS = 4000
"""The width of output that is not cut: far more than any row needs (rich sizes
a table to its content, so a wide console does not pad)."""


def output_console(wide: bool = False) -> Console:
    """Where describe/list/reset print: the terminal's width on a TTY, else never cut.

    On a terminal the tables fit its width (long cells end in "..."); piped
    output, and ``--wide``, keep every cell whole, so ``describe | grep`` and
    logs see full member ids and positions.
    """
    probe = Console()
    if wide or not probe.is_terminal:
        return Console(width=WIDE_COLUMNS)
    return probe


_STATE_STYLE = {"stable": "green", "rebalancing": "yellow", "empty": "dim"}


def _ago(ts: float | None, now: float | None = None) -> str:
    if not ts:
        return "-"
    return _duration((now or time.time()) - ts) + " ago"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        whole = int(seconds)
        return f"{whole // 60}m{whole % 60:02d}s"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _num(value: Any) -> str:
    return "-" if value is None else str(value)


def _rows(shard: dict[str, Any]) -> str:
    rows = shard.get("unread_rows")
    if rows is None:
        return "-"
    return f"{rows}" if shard.get("unread_rows_complete", True) else f">={rows}"


def describe_renderable(report: dict[str, Any]) -> Group:
    """The describe report (its JSON document, :meth:`GroupReport.to_dict
    <paimon_group.ops.report.GroupReport.to_dict>`) as header lines and two
    tables (members, shards)."""
    now = report.get("described_at") or time.time()
    if not report.get("exists", True):
        return Group(Text(f"group {report['group']} does not exist (yet)", style="yellow"))
    parts: list[Text | Table] = [*_describe_header(report, now), _members_table(report, now)]
    if report.get("tables") is not None:
        parts.append(_tables_table(report, now))
    parts.append(_shards_table(report, now))
    if report.get("sinks"):
        parts.append(_sinks_table(report))
    return Group(*parts)


def _sinks_table(report: dict[str, Any]) -> Table:
    """Per shard, its next snapshot in the coordinator and in each sink's
    target (the target holds the shard's output up to the snapshot before)."""
    table = Table(title="sinks: each shard's next snapshot, coordinator and target",
                  title_justify="left")
    table.add_column("shard", justify="right")
    table.add_column("coordinator", justify="right")
    sinks = report["sinks"]
    for sink in sinks:
        table.add_column(f"{sink['kind']} {sink['table']}", justify="right")
    for shard in report.get("shards", []):
        cells = [str(shard["shard"]), _num(shard.get("next_snapshot"))]
        for sink in sinks:
            positions = {int(k): v for k, v in (sink.get("positions") or {}).items()}
            cells.append(sink["error"] if sink.get("error") else
                         _num(positions.get(int(shard["shard"]))))
        table.add_row(*cells)
    return table


def _max_lag_snapshots(report: dict[str, Any]) -> int:
    """The slowest shard's snapshot lag (reports of older versions: from the shards)."""
    if report.get("max_lag_snapshots") is not None:
        return int(report["max_lag_snapshots"])
    return max((int(s.get("lag_snapshots") or 0) for s in report.get("shards", [])), default=0)


def _describe_header(report: dict[str, Any], now: float) -> list[Text]:
    state = str(report.get("state"))
    head = Text.assemble(
        ("group ", "bold"), str(report["group"]),
        ("  table ", "bold"), str(report.get("table") or "-"),
        ("  state ", "bold"), (state, _STATE_STYLE.get(state, "")),
        ("  generation ", "bold"), str(report.get("generation")),
        ("  leader ", "bold"), str(report.get("leader") or "-"),
    )
    totals = Text.assemble(
        ("latest snapshot ", "bold"), _num(report.get("latest_snapshot")),
        (" (", ""), _ago(report.get("latest_commit_time"), now), (")", ""),
        ("  earliest ", "bold"), _num(report.get("earliest_snapshot")),
        ("  max lag ", "bold"), f"{_max_lag_snapshots(report)} snapshots, ",
        _duration(report.get("max_lag_seconds")),
        ("  unread rows ", "bold"), _num(report.get("total_unread_rows")),
    ) if report.get("tables") is None else _tables_totals(report)
    parts = [head, totals]
    sharding = report.get("sharding")
    if sharding:
        parts.append(Text.assemble(
            ("sharding ", "bold"), str(sharding.get("rule")),
            (f" ({sharding.get('formula')})", "dim"),
            ("  shards ", "bold"), _num(report.get("num_shards")),
            ("  table kind ", "bold"), _num(report.get("table_kind")),
            ("  assignor ", "bold"), _num(report.get("assignor")),
        ))
    loss = _loss_line(report)
    if loss is not None:
        parts.append(loss)
    if report.get("expired_shards"):
        parts.append(Text(
            f"shards {report['expired_shards']} point at expired snapshots: they cannot "
            "continue until reset (paimon-group reset)", style="bold red"))
    return parts


def _loss_line(report: dict[str, Any]) -> Text | None:
    """``time to data loss 4m10s (shard 1); shard 3 24m02s`` for shards at
    risk, ``time to data loss: protected`` and the like for lagging shards
    without a risk; None when no shard lags (or for reports of older versions)."""
    why = report.get("data_loss")
    if why is None or why == "caught up":
        return None
    if report.get("time_to_data_loss_s") is None:
        return Text.assemble(("time to data loss: ", "bold"), str(why))
    at_risk = sorted((s for s in report.get("shards", [])
                      if s.get("time_to_data_loss_s") is not None),
                     key=lambda s: s["time_to_data_loss_s"])
    first, rest = at_risk[0], at_risk[1:6]
    seconds = float(first["time_to_data_loss_s"])
    style = "bold red" if seconds < 900 else "yellow"
    return Text.assemble(
        ("time to data loss ", "bold"), (_duration(seconds), style),
        f" (shard {first['shard']})",
        "".join(f"; shard {s['shard']} {_duration(s['time_to_data_loss_s'])}" for s in rest))


def _tables_totals(report: dict[str, Any]) -> Text:
    """The totals line of a group of several tables: its tables, and its
    shards' lag over every table."""
    tables = report.get("tables") or []
    dropped = sum(1 for t in tables if t.get("state") == "dropped")
    return Text.assemble(
        ("tables ", "bold"), str(len(tables) - dropped),
        *((f" ({dropped} dropped)",) if dropped else ()),
        ("  max lag ", "bold"), f"{_max_lag_snapshots(report)} snapshots, ",
        _duration(report.get("max_lag_seconds")),
        ("  total lag ", "bold"), f"{_num(report.get('total_lag_snapshots'))} snapshots",
        ("  unread rows ", "bold"), _num(report.get("total_unread_rows")),
    )


def _tables_table(report: dict[str, Any], now: float) -> Table:
    """Per table of a group of several tables: its group shards, owners,
    latest snapshot and lag totals; a dropped or unreadable one says so."""
    table = Table(title="tables", title_justify="left")
    for col in ("table", "shards", "owned", "latest", "max lag", "total lag", "behind",
                "unread", "state"):
        table.add_column(col, justify="left" if col in ("table", "state") else "right",
                         no_wrap=col != "table")
    styles = {"live": "green", "dropped": "dim", "unreadable": "red"}
    for t in report.get("tables") or []:
        state = str(t.get("state"))
        if state == "dropped":
            state = f"dropped {_ago(t.get('dropped_at'), now)}"
        elif t.get("error"):
            state = f"unreadable: {t['error']}"
        end = int(t["first"]) + int(t["shards"]) - 1
        table.add_row(
            str(t["name"]), f"{t['first']}..{end}", f"{t.get('owned_shards', 0)}/{t['shards']}",
            _num(t.get("latest_snapshot")), _num(t.get("max_lag_snapshots")),
            _num(t.get("total_lag_snapshots")), _duration(t.get("max_lag_seconds")),
            _num(t.get("total_unread_rows")),
            Text(state, style=styles.get(str(t.get("state")), "")))
    return table


def _members_table(report: dict[str, Any], now: float) -> Table:
    members = Table(title="members", title_justify="left")
    # The load column only for a group whose leader published shard loads.
    loads = any(m.get("load_share") is not None for m in report.get("members", []))
    for col in ("member", "host", "pid", "version", "started", "shards",
                *(("load",) if loads else ()), "session"):
        members.add_column(col, no_wrap=col != "member")
    for m in report.get("members", []):
        name = m["member_id"] + (" (leader)" if m.get("leader") else "")
        session = m.get("session_state", "live")
        share = m.get("load_share")
        members.add_row(
            name, _num(m.get("host")), _num(m.get("pid")), _num(m.get("version")),
            _ago(m.get("started_at"), now),
            ",".join(str(s) for s in m.get("owned_shards", [])) or "-",
            *((f"{share:.0%}" if share is not None else "-",) if loads else ()),
            Text(session, style="green" if session == "live" else "red"),
        )
    return members


def _shards_table(report: dict[str, Any], now: float) -> Table:
    shards = Table(title="shards", title_justify="left")
    # Short headers: the table must fit an 80-column terminal. "behind" is the
    # age of the oldest unread snapshot; "file" the Paimon consumer file.
    columns: tuple[str, ...] = ("shard", "owner", "epoch", "next", "lag", "behind", "unread",
                                "committed", "file")
    many = report.get("tables") is not None
    if many:  # the shard's table, and its shard number there (its consumer id's)
        columns = ("shard", "table", "local", *columns[1:])
    for col in columns:
        shards.add_column(col, justify="left" if col in ("owner", "table") else "right",
                          no_wrap=True)
    for s in report.get("shards", []):
        owner: Text | str = s["owner"] or Text("-", style="red")
        if s["owner"] and s.get("assigned_to") and s["owner"] != s["assigned_to"]:
            owner = Text(f"{s['owner']} -> {s['assigned_to']}", style="yellow")
        lag: Text | str = _num(s["lag_snapshots"])
        if s.get("expired"):
            lag = Text(f"{s['lag_snapshots']} EXPIRED", style="bold red")
        shards.add_row(
            str(s["shard"]),
            *((_table_cell(report, s), _num(s.get("table_shard"))) if many else ()),
            owner, _num(s["epoch"]), _num(s["next_snapshot"]), lag,
            _duration(s.get("lag_seconds")), _rows(s), _ago(s.get("last_commit"), now),
            _num(s.get("consumer_file")),
        )
    return shards


def _table_cell(report: dict[str, Any], shard: dict[str, Any]) -> str:
    """The shard's table, ``(dropped)`` after the name of a dropped one."""
    k = int(shard["shard"])
    for t in report.get("tables") or []:
        if int(t["first"]) <= k < int(t["first"]) + int(t["shards"]):
            return f"{t['name']} (dropped)" if t.get("state") == "dropped" else str(t["name"])
    return _num(shard.get("table"))


def render_describe(report: dict[str, Any], console: Console | None = None) -> None:
    (console or output_console()).print(describe_renderable(report))


def list_renderable(groups: Sequence[dict[str, Any]]) -> Table:
    table = Table(title="groups", title_justify="left")
    for col in ("group", "table", "shards", "members", "state", "gen", "max lag", "behind",
                "unread"):
        table.add_column(col, justify="left" if col in ("group", "table", "state") else "right",
                         no_wrap=col not in ("group", "table"))
    for g in groups:
        state = str(g.get("state"))
        table.add_row(
            g["group"], _num(g.get("table")), _num(g.get("num_shards")), _num(g.get("members")),
            Text(state, style=_STATE_STYLE.get(state, "")), _num(g.get("generation")),
            _num(g.get("max_lag_snapshots")), _duration(g.get("max_lag_seconds")),
            _num(g.get("total_unread_rows")),
        )
    return table


def render_list(groups: Sequence[dict[str, Any]], console: Console | None = None) -> None:
    (console or output_console()).print(list_renderable(groups))


def reset_plan_renderable(plan: dict[str, Any]) -> Group:
    table = Table(title=f"reset plan of group {plan['group']} ({plan['target']})",
                  title_justify="left")
    # A group of several tables: each shard's table and its shard number there.
    many = plan.get("tables") is not None
    columns = ("shard", *(("table", "local") if many else ()), "owner", "current", "new",
               "change", "note")
    for col in columns:
        table.add_column(col, justify="left" if col in ("owner", "note", "table") else "right")
    for row in plan["shards"]:
        current, new = row["current"], row["new"]
        change = "-" if current is None or new is None else f"{new - current:+d}"
        table.add_row(str(row["shard"]),
                      *((_num(row.get("table")), _num(row.get("table_shard"))) if many else ()),
                      _num(row.get("owner")), _num(current), _num(new),
                      change, row.get("note") or "")
    return Group(table, _reset_footer(plan))


def _reset_footer(plan: dict[str, Any]) -> Text:
    """What happened, or for a dry run what ``--execute`` would do now."""
    if plan.get("executed"):
        return Text("executed: positions and consumer files written", style="bold green")
    changing = [row for row in plan["shards"]
                if row.get("new") is not None and row.get("new") != row.get("current")]
    live = plan.get("live_members") or []
    if live:
        return Text(
            f"dry run: nothing changed. --execute would be refused now: live members "
            f"{', '.join(live)} (stop them first; --force fences them, see "
            "docs/operations.md)", style="bold yellow")
    if not changing:
        return Text("dry run: nothing changed; --execute would change nothing either",
                    style="yellow")
    shards = ", ".join(str(row["shard"]) for row in changing)
    return Text(f"dry run: nothing changed. --execute would move shard(s) {shards} "
                "and write their consumer files", style="yellow")


def render_reset_plan(plan: dict[str, Any], console: Console | None = None) -> None:
    (console or output_console()).print(reset_plan_renderable(plan))
