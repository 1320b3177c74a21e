"""Start positions: parsing, and resolution against real pypaimon tables."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from paimon_group.errors import ConfigError, SnapshotExpired
from paimon_group.reading.planner import BatchKind
from paimon_group.reading.start import (
    DEFAULT_START,
    ResolvedStart,
    StartKind,
    StartPosition,
    parse_start,
)
from paimon_group.reading.table import ShardedTable
from tests.support.tables import expire_snapshots, make_pk_table, write_rows


@pytest.fixture
def warehouse(tmp_path: Path) -> str:
    return str(tmp_path / "warehouse")


# -- parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("latest-full", StartPosition(StartKind.LATEST_FULL)),
        (" LATEST ", StartPosition(StartKind.LATEST)),
        ("earliest", StartPosition(StartKind.EARLIEST)),
        ("snapshot:1", StartPosition(StartKind.SNAPSHOT, snapshot_id=1)),
        ("snapshot:1234", StartPosition(StartKind.SNAPSHOT, snapshot_id=1234)),
        (
            "timestamp:2024-05-01T12:00:00Z",
            StartPosition(StartKind.TIMESTAMP, timestamp_ms=1714564800000),
        ),
        (
            "timestamp:2024-05-01T14:00:00+02:00",
            StartPosition(StartKind.TIMESTAMP, timestamp_ms=1714564800000),
        ),
        (  # no offset: UTC
            "timestamp:2024-05-01T12:00:00.250",
            StartPosition(StartKind.TIMESTAMP, timestamp_ms=1714564800250),
        ),
        ("timestamp:1714564800000", StartPosition(StartKind.TIMESTAMP, timestamp_ms=1714564800000)),
    ],
)
def test_parse_start_accepts(text: str, expected: StartPosition) -> None:
    assert parse_start(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "newest",
        "latest_full",
        "snapshot:",
        "snapshot:0",
        "snapshot:-3",
        "snapshot:abc",
        "timestamp:",
        "timestamp:yesterday",
        "timestamp:2024-13-01",
        "earliest:5",
    ],
)
def test_parse_start_rejects_with_one_clear_line(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_start(text)
    message = str(info.value)
    assert "\n" not in message
    assert repr(text) in message


@pytest.mark.parametrize(
    "text",
    ["latest-full", "latest", "earliest", "snapshot:42", "timestamp:2024-05-01T12:00:00.250Z"],
)
def test_start_position_text_round_trips(text: str) -> None:
    assert str(parse_start(text)) == text
    assert parse_start(str(parse_start(text))) == parse_start(text)


def test_default_start_is_latest_full() -> None:
    assert DEFAULT_START == parse_start("latest-full")


# -- resolution ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["latest-full", "latest", "earliest", "timestamp:2024-05-01T12:00:00Z"]
)
def test_empty_table_starts_at_snapshot_one(warehouse: str, text: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=4)
    table = ShardedTable.open(warehouse, "db.t")
    resolved = table.resolve_start(parse_start(text))
    assert resolved == ResolvedStart(next_snapshot=1, full_scan_snapshot=None)

    # Nothing the first writer commits is missed.
    write_rows(warehouse, "db.t", range(10))
    step = table.planner(2).plan_next([0, 1], resolved.next_snapshot)
    assert step is not None and step.kind is BatchKind.DELTA
    assert sum(step.estimated_rows(k) for k in (0, 1)) == 10


def test_snapshot_start_on_an_empty_table(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=4)
    table = ShardedTable.open(warehouse, "db.t")
    assert table.resolve_start(parse_start("snapshot:3")) == ResolvedStart(3)


def test_latest_full_latest_and_snapshot(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=4)
    for v in range(4):
        write_rows(warehouse, "db.t", [v], v=v)
    table = ShardedTable.open(warehouse, "db.t")

    assert table.resolve_start(parse_start("latest-full")) == ResolvedStart(5, 4)
    assert table.resolve_start(parse_start("latest")) == ResolvedStart(5, None)
    assert table.resolve_start(parse_start("earliest")) == ResolvedStart(2, 1)
    assert table.resolve_start(parse_start("snapshot:2")) == ResolvedStart(2, None)
    # A future snapshot is waited for, not refused.
    assert table.resolve_start(parse_start("snapshot:9")) == ResolvedStart(9, None)


def test_earliest_after_expiry_full_scans_the_earliest_retained_snapshot(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=4)
    for v in range(6):
        write_rows(warehouse, "db.t", range(v * 10, v * 10 + 10), v=v)
    expire_snapshots(warehouse, "db.t", keep_from=4)
    table = ShardedTable.open(warehouse, "db.t")

    resolved = table.resolve_start(parse_start("earliest"))

    assert resolved == ResolvedStart(next_snapshot=5, full_scan_snapshot=4)
    # The full scan of snapshot 4 holds the rows of the expired commits too.
    planner = table.planner(2)
    full = planner.plan_full([0, 1], 4)
    ids = sorted(
        i for k in (0, 1) for i in planner.read_arrow(full.splits[k]).column("id").to_pylist()
    )
    assert ids == list(range(40))


def test_snapshot_start_below_the_earliest_retained_is_expired(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=4)
    for v in range(5):
        write_rows(warehouse, "db.t", [v], v=v)
    expire_snapshots(warehouse, "db.t", keep_from=3)
    table = ShardedTable.open(warehouse, "db.t")

    with pytest.raises(SnapshotExpired) as info:
        table.resolve_start(parse_start("snapshot:2"))
    assert "earliest retained: 3" in str(info.value)
    assert table.resolve_start(parse_start("snapshot:3")) == ResolvedStart(3)


def _first_at_or_after(table: ShardedTable, time_ms: int) -> int:
    """Linear reference for the binary search in resolve_start."""
    latest = table.latest_snapshot_id()
    earliest = table.earliest_snapshot_id()
    assert latest is not None and earliest is not None
    for snapshot_id in range(earliest, latest + 1):
        commit_ms = table.snapshot_commit_time_ms(snapshot_id)
        assert commit_ms is not None
        if commit_ms >= time_ms:
            return snapshot_id
    return latest + 1


def _at(time_ms: int) -> str:
    when = datetime.fromtimestamp(time_ms / 1000, tz=UTC)
    return "timestamp:" + when.isoformat(timespec="milliseconds")


def test_timestamp_starts_at_the_first_snapshot_committed_at_or_after_it(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=4)
    for v in range(7):
        write_rows(warehouse, "db.t", [v], v=v)
    table = ShardedTable.open(warehouse, "db.t")
    times = {i: table.snapshot_commit_time_ms(i) for i in range(1, 8)}
    assert all(t is not None for t in times.values())

    probes = [times[1] - 1_000, times[3], times[3] + 1, times[6], times[7], times[7] + 1]
    for probe in probes:
        assert probe is not None
        expected = _first_at_or_after(table, probe)
        for text in (_at(probe), f"timestamp:{probe}"):
            assert table.resolve_start(parse_start(text)) == ResolvedStart(expected), text
    # After the last commit: only what is committed later.
    assert table.resolve_start(parse_start(f"timestamp:{times[7] + 1}")) == ResolvedStart(8)
    # Before everything, with nothing expired: from snapshot 1.
    assert table.resolve_start(parse_start("timestamp:0")) == ResolvedStart(1)


def test_timestamp_older_than_the_retained_history_is_expired(warehouse: str) -> None:
    make_pk_table(warehouse, "db.t", buckets=4)
    for v in range(5):
        write_rows(warehouse, "db.t", [v], v=v)
    expire_snapshots(warehouse, "db.t", keep_from=3)
    table = ShardedTable.open(warehouse, "db.t")

    with pytest.raises(SnapshotExpired) as info:
        table.resolve_start(parse_start("timestamp:0"))
    assert "--start earliest" in str(info.value) and "\n" not in str(info.value)
    last = table.snapshot_commit_time_ms(5)
    assert last is not None
    assert table.resolve_start(parse_start(f"timestamp:{last + 1}")) == ResolvedStart(6)
