"""The leader's frequent checks that a group's tables are still its tables
(protocol/identity.py ``IdentityChecks``): on a local file system a table
found in place is checked again by a ``stat`` of its ``schema-0``, read again
only when that is another file; a dropped or re-created table is never taken
for the one expected."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from paimon_group.protocol.identity import IdentityChecks, identity_signature, table_identity
from paimon_group.store.files import file_signature
from tests.support.tables import catalog, make_pk_table, open_table


class CountedReads:
    def __init__(self) -> None:
        self.reads = 0

    def __call__(self, table: Any) -> str:
        self.reads += 1
        return table_identity(table)


def _recreate(warehouse: Path, name: str, scratch: Path) -> None:
    """DROP TABLE and CREATE TABLE under the same name (made aside, renamed in)."""
    db, table = name.split(".")
    make_pk_table(scratch, name, buckets=2)
    path = warehouse / f"{db}.db" / table
    os.rename(path, f"{path}.dropped")
    os.rename(scratch / f"{db}.db" / table, path)


def test_a_table_found_in_place_is_checked_again_by_its_file_alone(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    make_pk_table(wh, "db.t", buckets=2)
    table = open_table(str(wh), "db.t")
    expected = table_identity(table)
    reads = CountedReads()
    checks = IdentityChecks(identity=reads)
    assert checks.in_place(table, expected) and reads.reads == 1
    assert checks.in_place(table, expected) and checks.in_place(table, expected)
    assert reads.reads == 1  # the same schema-0: not read again
    assert not checks.in_place(table, "schema-0@1")  # another identity expected: read
    assert reads.reads == 2

    time.sleep(0.01)  # a creation in another millisecond: another identity
    _recreate(wh, "db.t", tmp_path / "aside")
    assert not checks.in_place(table, expected)  # another schema-0: read, not the one
    assert not checks.in_place(table, expected) and reads.reads == 4
    renewed = table_identity(table)
    assert renewed != expected and checks.in_place(table, renewed)

    catalog(str(wh)).drop_table("db.t")
    assert identity_signature(table) is None
    assert not checks.in_place(table, renewed)


def test_a_file_replaced_during_its_read_is_not_remembered(tmp_path: Path) -> None:
    """The signature is taken before and after the read: a schema-0 replaced
    between the two is read again at the next check."""
    wh = tmp_path / "wh"
    make_pk_table(wh, "db.t", buckets=2)
    table = open_table(str(wh), "db.t")
    expected = table_identity(table)
    signatures = iter([(1,), (2,), (2,), (2,), (2,)])
    reads = CountedReads()
    checks = IdentityChecks(identity=reads, signature=lambda _: next(signatures))
    assert checks.in_place(table, expected)  # signed (1,), read, then (2,): not kept
    assert checks.in_place(table, expected) and reads.reads == 2  # (2,) read and kept
    assert checks.in_place(table, expected) and reads.reads == 2


def test_without_a_signature_every_check_reads(tmp_path: Path) -> None:
    """An object store has no cheap signature: each check reads the identity."""
    wh = tmp_path / "wh"
    make_pk_table(wh, "db.t", buckets=2)
    table = open_table(str(wh), "db.t")
    reads = CountedReads()
    checks = IdentityChecks(identity=reads, signature=lambda _: None)
    for _ in range(3):
        assert checks.in_place(table, table_identity(table))
    assert reads.reads == 3


def test_a_files_signature_is_of_that_file(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    make_pk_table(wh, "db.t", buckets=2)
    table = open_table(str(wh), "db.t")
    path = f"{str(table.table_path).rstrip('/')}/schema/schema-0"
    first = file_signature(table.file_io, path)
    assert first is not None and first == identity_signature(table)
    assert file_signature(table.file_io, path) == first
    text = Path(path).read_text()
    os.unlink(path)
    assert file_signature(table.file_io, path) is None
    Path(path).write_text(text)  # the same text, written again: another file
    assert file_signature(table.file_io, path) not in (None, first)
    assert file_signature(object(), path) is None  # not a local file IO: no answer
