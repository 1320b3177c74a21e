"""Output that fits: piped tables are never cut, generated member ids are short."""

from __future__ import annotations

import re
import time

from paimon_group.config.member import generated_member_id
from paimon_group.ops.render import describe_renderable, list_renderable, output_console

LONG_MEMBER = "worker-" + "x" * 70 + "-1234-abcdef"


def report() -> dict[str, object]:
    now = time.time()
    return {
        "group": "orders", "table": "db.orders", "state": "stable", "generation": 12345,
        "leader": LONG_MEMBER, "latest_snapshot": 987654321, "latest_commit_time": now,
        "earliest_snapshot": 1, "total_lag_snapshots": 0, "max_lag_seconds": 0.0,
        "total_unread_rows": 0, "described_at": now, "num_shards": 1,
        "members": [{"member_id": LONG_MEMBER, "leader": True, "host": "h", "pid": 1,
                     "version": "1", "started_at": now, "owned_shards": [0]}],
        "shards": [{"shard": 0, "owner": LONG_MEMBER, "assigned_to": LONG_MEMBER,
                    "epoch": 123456789, "next_snapshot": 987654322, "lag_snapshots": 0,
                    "lag_seconds": 0.0, "unread_rows": 0, "last_commit": now,
                    "consumer_file": 987654322}],
    }


def test_piped_describe_and_list_are_not_cut() -> None:
    # Under pytest stdout is not a terminal, as in `paimon-group describe | grep`.
    console = output_console()
    assert not console.is_terminal
    with console.capture() as captured:
        console.print(describe_renderable(report()))
        console.print(list_renderable([{"group": LONG_MEMBER, "table": "db." + "t" * 90,
                                        "num_shards": 4, "members": 2, "state": "stable",
                                        "generation": 7, "total_lag_snapshots": 0}]))
    text = captured.get()
    assert "…" not in text and "..." not in text, text
    assert text.count(LONG_MEMBER) >= 3
    for number in ("123456789", "987654322", "12345"):
        assert number in text
    assert "db." + "t" * 90 in text


def test_wide_is_not_cut_either() -> None:
    assert output_console(wide=True).width >= 1000


def test_generated_member_ids_fit_a_table() -> None:
    member = generated_member_id()
    assert len(member) <= 16 + 1 + 7 + 1 + 6, member
    assert re.fullmatch(r"[A-Za-z0-9_-]+-\d+-[0-9a-f]{6}", member), member


def test_describe_shows_the_slowest_shard_not_a_sum_over_shards() -> None:
    """Four shards one snapshot behind are one snapshot behind, not four."""
    data = report()
    data["shards"] = [{**data["shards"][0], "shard": k, "lag_snapshots": 1, "lag_seconds": 3.0}  # type: ignore[index]
                      for k in range(4)]
    data.update(total_lag_snapshots=4, max_lag_snapshots=1, max_lag_seconds=3.0)
    console = output_console()
    with console.capture() as captured:
        console.print(describe_renderable(data))
    text = captured.get()
    assert "max lag 1 snapshots" in text and "total lag" not in text, text


def test_describe_shows_each_members_share_of_the_load_for_a_load_group() -> None:
    data = report()
    member = data["members"][0]  # type: ignore[index]
    other = {**member, "member_id": "m2", "leader": False, "owned_shards": [1]}
    console = output_console()
    with console.capture() as captured:
        console.print(describe_renderable({**data, "sharding": {"rule": "bucket",
                                                                "formula": "bucket % S"},
                                           "assignor": "count"}))
    header = next(line for line in captured.get().splitlines() if "session" in line)
    assert "load" not in header  # a count group has no load column
    data.update(assignor="load", sharding={"rule": "bucket", "formula": "bucket % S"},
                members=[{**member, "load_share": 0.625}, {**other, "load_share": 0.375}])
    with console.capture() as captured:
        console.print(describe_renderable(data))
    text = captured.get()
    assert "assignor load" in text, text
    assert "load" in next(line for line in text.splitlines() if "session" in line)
    assert "62%" in text and "38%" in text, text


def test_the_help_names_the_lag_list_shows_the_max_lag() -> None:
    """``list`` shows the slowest shard's lag: its help, and the command list, say so."""
    from click.testing import CliRunner

    from paimon_group.cli import main

    for args in (["--help"], ["list", "--help"]):
        result = CliRunner().invoke(main, args, terminal_width=200)
        assert result.exit_code == 0, result.output
        assert "max lag" in result.output and "total lag" not in result.output, result.output
