"""The bad-input matrix of a running group (real ``paimon-group run`` processes).

Each case gives one clear error line, a non-zero exit where the fault is
fatal, and loses nothing: the rows not yet committed are still there for
the next run (positions are never moved past them). On the embedded SQLite
coordinator: these are about the member's handling of bad data, which does
not depend on the backend. (Bad URLs, a missing table and bad names are in
``tests/test_cli_errors.py``.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pytest

from coordinators import open_coordinator
from coordinators.protocol import Put
from paimon_group.protocol.names import GroupKeys
from tests.support.group_procs import GroupHarness
from tests.support.tables import catalog, expire_snapshots, open_table, write_rows

pytestmark = [pytest.mark.slow]

EXIT_TIMEOUT_S = 120


def error_lines(log: str) -> list[str]:
    """The ``error: ...`` lines of a member's output (logs may come before)."""
    return [line for line in log.splitlines() if line.startswith("error:")]


def assert_one_clear_line(h: GroupHarness, member: str, needle: str) -> str:
    log = h.log(member)
    errors = error_lines(log)
    assert len(errors) == 1, log[-4000:]
    assert needle in errors[0], errors[0]
    assert "Traceback" not in log, log[-4000:]
    return errors[0]


def group(tmp_path: Path, **kwargs: object) -> GroupHarness:
    return GroupHarness(tmp_path, f"sqlite://{tmp_path}/coordinator.sqlite", buckets=4,
                        **kwargs)  # type: ignore[arg-type]


def coordinator_value(h: GroupHarness, key: str) -> bytes | None:
    async def go() -> bytes | None:
        async with open_coordinator(h.coordinator) as c:
            entry = await c.get(key)
            return None if entry is None else entry.value

    return asyncio.run(go())


def put_raw(h: GroupHarness, key: str, value: bytes) -> None:
    async def go() -> None:
        async with open_coordinator(h.coordinator) as c:
            assert await c.commit([], [Put(key, value)])

    asyncio.run(go())


def table_dir(h: GroupHarness) -> Path:
    return Path(str(open_table(h.warehouse, h.table).table_path).removeprefix("file://"))


def delivered(h: GroupHarness) -> set[int]:
    return set(h.history().delivered_counts())


def test_corrupt_position_in_the_coordinator(tmp_path: Path) -> None:
    h = group(tmp_path)
    try:
        h.write(range(0, 40))
        h.start("m0")
        h.wait_caught_up({"m0"})
        assert h.terminate("m0") == 0
        key = GroupKeys(h.group).position(0)
        put_raw(h, key, b"\x00not json")
        h.write(range(40, 80))
        h.start("m0")
        code = h.procs["m0"].wait(timeout=EXIT_TIMEOUT_S)
        h.exit_codes.setdefault("m0", []).append(code)
        assert code != 0, h.log("m0")[-4000:]
        assert_one_clear_line(h, "m0", f"corrupt value at coordinator key {key!r}")
        # Nothing lost: the bad value is left for an operator (never
        # overwritten by a guess), so the rows after it are still unread.
        assert coordinator_value(h, key) == b"\x00not json"
    finally:
        h.cleanup()


def test_consumer_directory_cannot_be_created(tmp_path: Path) -> None:
    # Tests run as root, so chmod does not stop a write: a plain file where
    # the consumer directory should be does.
    h = group(tmp_path)
    try:
        (table_dir(h) / "consumer").write_text("not a directory")
        h.write(range(0, 40))
        h.start("m0")
        h.wait_caught_up({"m0"})
        h.write(range(40, 80))
        h.wait_caught_up({"m0"})
        assert delivered(h) == h.written
        assert h.terminate("m0") == 0, h.log("m0")[-4000:]
        # Not fatal: the consumer files only mirror the coordinator's
        # positions (for Paimon's snapshot expiration); each failed write is
        # a logged warning and consumption goes on.
        log = h.log("m0")
        assert "consumer file not written" in log, log[-4000:]
        assert error_lines(log) == []
    finally:
        h.cleanup()


def test_table_dropped_while_running(tmp_path: Path) -> None:
    h = group(tmp_path)
    try:
        h.write(range(0, 40))
        h.start("m0")
        h.wait_caught_up({"m0"})
        catalog(h.warehouse).drop_table(h.table)
        code = h.procs["m0"].wait(timeout=EXIT_TIMEOUT_S)
        h.exit_codes.setdefault("m0", []).append(code)
        assert code != 0, h.log("m0")[-4000:]
        assert_one_clear_line(h, "m0", h.table)
        assert delivered(h) == h.written
    finally:
        h.cleanup()


def test_snapshot_expired_under_a_slow_shard(tmp_path: Path) -> None:
    h = group(tmp_path)
    try:
        h.write(range(0, 40))
        h.start("m0")
        h.wait_caught_up({"m0"})
        assert h.terminate("m0") == 0
        # The group falls behind (here: stopped) while the table moves on and
        # expires the snapshots it has not read.
        for start in range(40, 160, 40):
            h.write(range(start, start + 40))
        latest = write_rows(h.warehouse, h.table, range(160, 200))
        h.written.update(range(160, 200))
        expire_snapshots(h.warehouse, h.table, keep_from=latest)
        h.start("m0")
        code = h.procs["m0"].wait(timeout=EXIT_TIMEOUT_S)
        h.exit_codes.setdefault("m0", []).append(code)
        assert code != 0, h.log("m0")[-4000:]
        assert_one_clear_line(h, "m0", "expired")
        # Loud, never skipped: no row of the expired snapshots was delivered
        # and no position jumped over them.
        assert delivered(h) == set(range(0, 40))
    finally:
        h.cleanup()


def test_schema_change_while_streaming(tmp_path: Path) -> None:
    from pypaimon.schema.data_types import AtomicType
    from pypaimon.schema.schema_change import SchemaChange

    h = group(tmp_path)
    try:
        h.write(range(0, 40))
        h.start("m0")
        h.wait_caught_up({"m0"})
        catalog(h.warehouse).alter_table(
            h.table, [SchemaChange.add_column("extra", AtomicType("BIGINT"))])
        table = open_table(h.warehouse, h.table)
        ids = list(range(40, 80))
        data = pa.table({
            "id": pa.array(ids, pa.int64()),
            "v": pa.array([0] * len(ids), pa.int64()),
            "payload": pa.array([f"p{i}" for i in ids], pa.string()),
            "extra": pa.array(ids, pa.int64()),
        })
        builder = table.new_batch_write_builder()
        write, commit = builder.new_write(), builder.new_commit()
        try:
            write.write_arrow(data)
            commit.commit(write.prepare_commit())
        finally:
            write.close()
            commit.close()
        h.written.update(ids)
        h.wait_caught_up({"m0"})
        assert delivered(h) == h.written
        assert h.terminate("m0") == 0, h.log("m0")[-4000:]
    finally:
        h.cleanup()


