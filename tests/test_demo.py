"""``paimon-group demo`` runs on the package alone and accounts for every row."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from paimon_group.process.demo import Demo, demo_view
from tests.support.group_procs import REPO


@pytest.mark.slow
def test_demo_delivers_every_row(tmp_path: Path) -> None:
    # An 80x24 terminal, as rich sees it (COLUMNS, LINES). Piped, rich's Live
    # prints its final frame once: the screenshot of the end of the demo.
    # Its own temporary directory (under TMPDIR), removed at the end, saying so.
    env = {**os.environ, "COLUMNS": "80", "LINES": "24", "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "paimon_group", "demo", "--seconds", "8"],
        cwd=REPO, capture_output=True, text=True, timeout=400, env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert list(tmp_path.iterdir()) == [], result.stdout[-3000:]
    assert f"removed the demo's directory {tmp_path.resolve()}/paimon-group-demo-" \
        in result.stdout, result.stdout[-3000:]
    assert "every written row was delivered" in result.stdout
    assert "missing 0" in result.stdout
    assert "'worker-0': 0" in result.stdout
    frame = result.stdout.split("accounting")[0].splitlines()
    assert len(frame) <= 24 and all(len(line) <= 80 for line in frame), result.stdout
    text = "\n".join(frame)
    assert "─ events ─" in text and "all workers stopped" in text, text
    for worker in ("worker-0", "worker-1", "worker-2"):
        assert re.search(rf"{worker} +stopped \(exit 0\)", text), text
    assert "running" not in text and "killed" not in text.split("─ events ─")[0], text


def sample_report(shards: int = 8) -> dict[str, Any]:
    members = [f"worker-{i}" for i in range(3)]
    return {
        "group": "demo", "state": "rebalancing", "generation": 12, "latest_snapshot": 123,
        "total_lag_snapshots": 17,
        "members": [{"member_id": m, "owned_shards": [s for s in range(shards) if s % 3 == i]}
                    for i, m in enumerate(members)],
        "shards": [{"shard": s, "owner": members[s % 3]} for s in range(shards)],
    }


def screen(renderable: Any) -> list[str]:
    console = Console(width=80, height=24, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text().rstrip("\n").splitlines()


def test_demo_screen_fits_80x24_with_its_events() -> None:
    events = [f"03:00:{i:02d} event number {i}" for i in range(20)]
    statuses = {"worker-0": "running", "worker-1": "killed", "worker-2": "running"}
    lines = screen(demo_view(sample_report(), statuses, events))
    # One line above the live view is the demo's banner.
    assert len(lines) <= 23, "\n".join(lines)
    text = "\n".join(lines)
    assert "─ events ─" in text
    # The first events (the demo's setup), a line for those left out, the latest.
    assert "event number 0" in text and "event number 19" in text
    assert "... 11 more ..." in text and "event number 4 " not in text
    assert re.search(r"worker-1 +killed", text)
    assert "7:worker-1" in text


def test_final_frame_shows_stopped_workers() -> None:
    statuses = {f"worker-{i}": "stopped (exit 0)" for i in range(3)}
    report = {"group": "demo", "state": "empty", "generation": 13, "latest_snapshot": 130,
              "total_lag_snapshots": 0, "members": [],
              "shards": [{"shard": s, "owner": None} for s in range(8)]}
    text = "\n".join(screen(demo_view(report, statuses, ["03:00:00 all workers stopped"])))
    for i in range(3):
        assert re.search(rf"worker-{i} +stopped \(exit 0\) +-", text), text
    assert "state empty" in text and "0:- " in text


@pytest.mark.slow
def test_demo_on_an_s3_warehouse(tmp_path: Path, s3_warehouse: Any) -> None:
    """``demo --warehouse s3://...``: the table on the S3 server, the keys from the
    environment (not argv); a second demo in that warehouse is refused in one line."""
    env = {**os.environ, **s3_warehouse.env(), "COLUMNS": "80", "LINES": "24"}
    command = [sys.executable, "-m", "paimon_group", "demo", "--seconds", "6", "--workers", "2",
               "--warehouse", s3_warehouse.uri]
    result = subprocess.run([*command, "--dir", str(tmp_path / "demo")], cwd=REPO,
                            capture_output=True, text=True, timeout=400, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "every written row was delivered" in result.stdout
    again = subprocess.run([*command, "--dir", str(tmp_path / "again")], cwd=REPO,
                           capture_output=True, text=True, timeout=120, env=env)
    assert again.returncode == 2, again.stdout + again.stderr
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1 and "demo.events already exists" in lines[0], again.stderr


def test_the_events_box_keeps_the_demos_first_events() -> None:
    """A demo of 3 workers has 8 events: the box shows them all, from the first."""
    events = ["00:00:00 writer started: a snapshot of 40 rows every 300 ms",
              *(f"00:00:01 started worker-{i} (pid 1000{i})" for i in range(3)),
              "00:00:05 SIGKILL worker-1: its shards move after the session timeout",
              "00:00:11 started worker-1 (pid 10003)",
              "00:00:20 stopping workers with SIGTERM (graceful handoff)",
              "00:00:21 all workers stopped"]
    statuses = {f"worker-{i}": "stopped (exit 0)" for i in range(3)}
    lines = screen(demo_view(sample_report(), statuses, events))
    assert len(lines) <= 23, "\n".join(lines)
    box = lines[next(i for i, line in enumerate(lines) if "─ events ─" in line) + 1:-1]
    assert [line.strip("│ ") for line in box] == events, "\n".join(lines)


def test_the_box_cuts_a_long_event_and_shows_brackets_as_they_are() -> None:
    events = ["00:00:00 describe: " + "x" * 100, "00:00:01 describe: [Errno 2] [bold]y[/bold]"]
    lines = screen(demo_view(sample_report(), {"worker-0": "running"}, events))
    box = lines[next(i for i, line in enumerate(lines) if "─ events ─" in line) + 1:-1]
    assert len(box) == 2 and box[0].endswith("… │"), "\n".join(lines)
    assert "[Errno 2] [bold]y[/bold]" in box[1], "\n".join(lines)


def test_the_demo_removes_its_temporary_directory_unless_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    removed = Demo(3, 5, None)
    assert removed.base.parent == tmp_path.resolve()
    removed.finish(ok=True, keep=False)
    assert not removed.base.exists()
    out = capsys.readouterr().out
    assert f"removed the demo's directory {removed.base} (--keep keeps it" in out
    kept = Demo(3, 5, None)
    kept.finish(ok=True, keep=True)
    assert kept.base.is_dir()
    assert capsys.readouterr().out.strip() == (
        f"the demo's directory is kept: {kept.base} (rm -r {kept.base} when done)")
    failed = Demo(3, 5, None)
    failed.finish(ok=False, keep=False)  # a failed demo's logs tell why: kept
    assert failed.base.is_dir() and "with the workers' logs" in capsys.readouterr().out
    given = Demo(3, 5, str(tmp_path / "mine"))
    given.finish(ok=True, keep=False)  # --dir is the user's: never removed
    assert capsys.readouterr().out.strip() == (
        f"the demo's directory is kept: {tmp_path.resolve() / 'mine'}")
