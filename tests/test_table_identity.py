"""A table dropped and re-created under the same name is refused, by running
members and by joining ones (issue 12, finding 9), with real ``paimon-group
run`` processes on a real table.

The group's positions are snapshot ids of the old table: a member that kept
them waited in silence (measured: it kept running and delivered nothing), and
once the new table caught up, would have skipped its first snapshots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from paimon_group.protocol.identity import table_identity
from tests.support.group_procs import GroupHarness
from tests.support.tables import make_pk_table, open_table, write_rows


def _recreate(warehouse: str, name: str, scratch: Path) -> None:
    """DROP TABLE + CREATE TABLE under the same name. The new table is made
    aside and swapped in with two renames, so that no member can look while
    there is no table at all (that is a TableNotFound, another check)."""
    db, table = name.split(".")
    aside = str(scratch / "wh-new")
    make_pk_table(aside, name, buckets=2)
    path = os.path.join(warehouse, f"{db}.db", table)
    os.rename(path, path + ".dropped")
    os.rename(os.path.join(aside, f"{db}.db", table), path)


@pytest.mark.timeout(180)
def test_recreated_table_is_refused_by_running_and_joining_members(tmp_path: Path) -> None:
    h = GroupHarness(tmp_path, f"sqlite://{tmp_path}/coord.sqlite", buckets=2)
    try:
        old_id = table_identity(open_table(h.warehouse, h.table))
        for k in range(3):
            h.write(range(k * 10, k * 10 + 10))
        h.start("m0")
        h.wait_caught_up({"m0"})

        _recreate(h.warehouse, h.table, tmp_path)
        assert table_identity(open_table(h.warehouse, h.table)) != old_id
        write_rows(h.warehouse, h.table, range(100, 110))  # the new table's snapshot 1

        # The running member notices within its table check, and exits 1.
        assert h.procs["m0"].wait(timeout=60) == 1
        errors = [line for line in h.log("m0").splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "dropped and re-created" in errors[0], h.log("m0")
        assert "paimon-group delete" in errors[0]

        # A member started now is refused at join, with one line, exit 1.
        h.start("m1")
        assert h.procs["m1"].wait(timeout=60) == 1
        errors = [line for line in h.log("m1").splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "dropped and re-created" in errors[0], h.log("m1")
        assert "m1" not in {m["member_id"] for m in h.describe()["members"]}
    finally:
        h.cleanup()
