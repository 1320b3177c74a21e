"""A ROW whose fields are all null, read as the engine reads it (issue 22).

The engine's Parquet reader reads such a ROW as a null ROW wherever it is:
an element of an ARRAY, a value of a MAP, a field of a ROW inside an
ARRAY, a top-level ROW column, a ROW inside a top-level ROW (bottom-up: a
ROW of null ROWs and nulls is null). Its ORC and Avro readers keep a ROW
of nulls. We read each format as the engine does: the planner on the
Arrow path (no split falling back) and on pypaimon's reader
(``PAIMON_GROUP_ARROW_READER=0``), primary-key and append tables, and a
group member on its initial and delta paths.

Never written here, because the engine's Parquet reader cannot read them
(it fails with an ``ArrayIndexOutOfBoundsException``): a null ROW holding
a ROW (a null ``top2``, a null element of ``nest``). Nor is a table
compacted here: the engine's compaction writes the ROWs it read as null
(``top2`` holding ``((null, null), null)``) as null ROWs, which it then
cannot read (the ``nested_update`` test compacts ``ARRAY<ROW>`` columns).
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from paimon_group import GroupMember, MemberConfig
from paimon_group.reading.planner import ShardPlanner
from paimon_group.reading.table import ShardedTable
from tests.engine.engine import Engine

pytestmark = pytest.mark.engine

INNER = pa.struct([pa.field("a", pa.int32()), pa.field("b", pa.string())])
OUTER = pa.struct([pa.field("r", INNER), pa.field("x", pa.int32())])
SCHEMA = pa.schema([pa.field("k", pa.int32(), nullable=False),
                    pa.field("arr", pa.list_(INNER)), pa.field("m", pa.map_(pa.string(), INNER)),
                    pa.field("nest", pa.list_(OUTER)), pa.field("top", INNER),
                    pa.field("top2", OUTER)])
TYPES = {"arr": "ARRAY<ROW<a INT, b STRING>>", "m": "MAP<STRING, ROW<a INT, b STRING>>",
         "nest": "ARRAY<ROW<r ROW<a INT, b STRING>, x INT>>", "top": "ROW<a INT, b STRING>",
         "top2": "ROW<r ROW<a INT, b STRING>, x INT>"}
COLUMNS = SCHEMA.names


def _inner(rnd: random.Random, nullable: bool = True) -> tuple[str, list[Any]] | None:
    """A null ROW, one with all fields null, some null, or none."""
    if nullable and rnd.random() < 0.15:
        return None
    return ("row", [rnd.choice([None, None, 1, 2]), rnd.choice([None, None, "x"])])


def _outer(rnd: random.Random) -> tuple[str, list[Any]]:
    return ("row", [_inner(rnd), rnd.choice([None, None, 5])])


def _list(rnd: random.Random, element: Any) -> list[Any] | None:
    return None if rnd.random() < 0.15 else [element() for _ in range(rnd.randint(0, 3))]


def _row(rnd: random.Random, k: int) -> dict[str, Any]:
    keys = rnd.sample(["a", "b", "c"], rnd.randint(0, 3))
    return {"k": k, "arr": _list(rnd, lambda: _inner(rnd)),
            "m": None if rnd.random() < 0.15 else ("map", [(key, _inner(rnd)) for key in keys]),
            "nest": _list(rnd, lambda: _outer(rnd)), "top": _inner(rnd), "top2": _outer(rnd)}


def _plain(value: Any) -> Any:
    """Our values (ROW as dict) in the engine's shape (ROW as tuple)."""
    if isinstance(value, dict):
        return tuple(_plain(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


def _sorted(rows: Any) -> list[tuple[Any, ...]]:
    """Rows (tuples by COLUMNS) in one order, each MAP's entries sorted by key:
    the engine's Avro reader gives a MAP in its hash order."""
    index = COLUMNS.index("m")
    return sorted(((*row[:index], None if row[index] is None else sorted(row[index]),
                    *row[index + 1:]) for row in rows), key=repr)


def _ours(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return _sorted(tuple(_plain(r[c]) for c in COLUMNS) for r in rows)


def _write(engine: Engine, warehouse: str, commits: int, rnd: random.Random) -> None:
    for _ in range(commits):
        keys = sorted(rnd.sample(range(10), rnd.randint(3, 8)))
        engine.write_rows(warehouse, [_row(rnd, k) for k in keys])


def _create(engine: Engine, warehouse: str, file_format: str, kind: str) -> None:
    options = {"bucket": "1", "file.format": file_format}
    if kind == "append":
        options["bucket-key"] = "k"
    engine.create_table(warehouse, SCHEMA, primary_keys=["k"] if kind == "primary-key" else [],
                        types=TYPES, options=options)


def _planner_rows(warehouse: str, latest: int) -> tuple[list[Any], list[Any], ShardPlanner]:
    planner = ShardPlanner(ShardedTable.open(warehouse, "db.t"), 1, include_row_kind=False,
                           batch_rows=4)
    splits = planner.plan_full([0], latest).splits[0]
    streamed = pa.Table.from_batches(list(planner.iter_batches(splits)), schema=planner.schema)
    return (_ours(planner.read_arrow(splits).to_pylist()), _ours(streamed.to_pylist()),
            planner)


@pytest.mark.parametrize("file_format", ["parquet", "orc", "avro"])
@pytest.mark.parametrize("kind", ["primary-key", "append"])
def test_all_null_rows_read_as_the_engine_reads(
    engine: Engine, file_format: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rnd = random.Random(f"{file_format}-{kind}")
    with tempfile.TemporaryDirectory() as tmp:
        warehouse = str(Path(tmp) / "wh")
        _create(engine, warehouse, file_format, kind)
        _write(engine, warehouse, 4, rnd)
        latest = ShardedTable.open(warehouse, "db.t").latest_snapshot_id()
        assert latest is not None
        expected = _sorted(row[1:] for _, row in engine.read_at(warehouse, latest))
        assert expected

        read, streamed, planner = _planner_rows(warehouse, latest)
        assert planner.view.read_path is not None and planner.view.read_path.fallback_splits == 0
        assert read == expected
        assert streamed == expected
        monkeypatch.setenv("PAIMON_GROUP_ARROW_READER", "0")  # pypaimon's reader
        read, streamed, planner = _planner_rows(warehouse, latest)
        assert planner.view.read_path is None
        assert read == expected
        assert streamed == expected


async def _member_rows(
    warehouse: str, engine: Engine, rnd: random.Random
) -> tuple[int, list[Any], list[Any]]:
    """The member's initial rows of the latest snapshot, then its delta rows
    of the two commits written once it has read them."""
    config = MemberConfig(group="engine", warehouse=warehouse, table="db.t",
                          coordinator=f"memory://engine-{uuid.uuid4().hex}", member_id="m",
                          session_timeout_s=3, poll_interval_ms=50)
    latest = ShardedTable.open(warehouse, "db.t").latest_snapshot_id()
    assert latest is not None
    initial_count = len(engine.read_at(warehouse, latest))
    initial: list[dict[str, Any]] = []
    delta: list[dict[str, Any]] = []
    async with GroupMember(config) as member:
        batches = member.batches()
        while len(initial) < initial_count:
            batch = await asyncio.wait_for(batches.__anext__(), timeout=60)
            assert batch.kind.value == "initial"
            initial += batch.to_arrow().to_pylist()
        _write(engine, warehouse, 2, rnd)
        delta_count = len(engine.stream(warehouse, latest + 1))
        while len(delta) < delta_count:
            batch = await asyncio.wait_for(batches.__anext__(), timeout=60)
            assert batch.kind.value == "delta"
            delta += batch.to_arrow().to_pylist()
    return latest, _ours(initial), _ours(delta)


@pytest.mark.parametrize("file_format", ["parquet", "orc"])
def test_a_group_member_reads_all_null_rows_as_the_engine(
    engine: Engine, file_format: str
) -> None:
    rnd = random.Random(f"member-{file_format}")
    with tempfile.TemporaryDirectory() as tmp:
        warehouse = str(Path(tmp) / "wh")
        _create(engine, warehouse, file_format, "primary-key")
        _write(engine, warehouse, 2, rnd)
        latest, initial, delta = asyncio.run(_member_rows(warehouse, engine, rnd))
        assert initial == _sorted(row[1:] for _, row in engine.read_at(warehouse, latest))
        assert delta == _sorted(row[1:] for row in engine.stream(warehouse, latest + 1))


@pytest.mark.parametrize("file_format", ["parquet", "orc"])
def test_files_of_an_older_schema_read_all_null_rows_as_the_engine(
    engine: Engine, file_format: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A column added since: the files written before read through the
    table's latest schema (``evolution.py``), ROWs as the engine reads them."""
    rnd = random.Random(f"evolved-{file_format}")
    with tempfile.TemporaryDirectory() as tmp:
        warehouse = str(Path(tmp) / "wh")
        _create(engine, warehouse, file_format, "primary-key")
        _write(engine, warehouse, 2, rnd)
        engine.alter(warehouse, ("add", "z", "INT"))
        _write(engine, warehouse, 1, rnd)
        latest = ShardedTable.open(warehouse, "db.t").latest_snapshot_id()
        assert latest is not None
        # The engine's rows without the added column (null in every row
        # written here).
        engine_rows = [row[1:] for _, row in engine.read_at(warehouse, latest)]
        assert all(row[-1] is None for row in engine_rows)
        expected = _sorted(row[:-1] for row in engine_rows)
        for arrow_reader in ("1", "0"):
            monkeypatch.setenv("PAIMON_GROUP_ARROW_READER", arrow_reader)
            read, streamed, planner = _planner_rows(warehouse, latest)
            assert planner.view.read_path is None or planner.view.read_path.fallback_splits == 0
            assert (read, streamed) == (expected, expected), arrow_reader
