"""The small-file reads on a local file system (paimon_group/store/files.py)
answer as pypaimon's own ``LocalFileIO`` calls do, for every path it takes:
plain, ``file:`` URLs (quoted too), absent files and directories, a path
through a file, its FUSE mapping of another store's paths."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from pypaimon.filesystem.local_file_io import FuseLocalFileIO, LocalFileIO

from paimon_group.store.files import (
    FileProbe,
    file_exists,
    local_directories,
    local_names,
    read_text,
)


def pypaimon_read(file_io: LocalFileIO, path: str) -> str | None:
    return str(file_io.read_file_utf8(path)) if file_io.exists(path) else None


def answer(read: Callable[[LocalFileIO, str], str | None], file_io: LocalFileIO,
           path: str) -> object:
    """What ``read`` returns, or the class of what it raises (a directory)."""
    try:
        return read(file_io, path)
    except OSError as err:
        return type(err)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "snapshot").mkdir()
    (tmp_path / "snapshot" / "snapshot-1").write_bytes(b'{"id": 1}\r\nsecond line\n')
    (tmp_path / "a b").mkdir()
    (tmp_path / "a b" / "schema-0").write_text("zero")
    return tmp_path


def paths(root: Path) -> list[str]:
    return [f"{root}/snapshot/snapshot-1", f"{root}/snapshot/snapshot-2",
            f"file://{root}/snapshot/snapshot-1", f"file:{root}/snapshot/snapshot-1",
            f"file://{root}/a%20b/schema-0", f"{root}/a b/schema-0",
            f"{root}/missing/schema-0", f"{root}/snapshot/snapshot-1/inside",
            f"{root}/snapshot/./snapshot-1", f"{root}//snapshot//snapshot-1",
            # A name that URL parsing changes; files at the root (a file: URL
            # whose directory alone is no path).
            f"file://{root}/a%20b/schema%2D0", "file:/tmp", "file:///tmp", "/tmp"]


def test_local_reads_answer_as_pypaimons_own(tree: Path) -> None:
    file_io = LocalFileIO(str(tree))
    for _ in range(2):  # the second time from the translated directories
        for path in paths(tree):
            assert file_exists(file_io, path) == file_io.exists(path), path
            assert answer(read_text, file_io, path) == answer(pypaimon_read, file_io, path), path
    assert read_text(file_io, f"{tree}/snapshot/snapshot-1") == '{"id": 1}\r\nsecond line\n'
    assert file_exists(file_io, f"{tree}/snapshot")  # as pypaimon's exists: a directory too
    with pytest.raises(IsADirectoryError):  # as pypaimon's read
        read_text(file_io, f"{tree}/snapshot")


def test_a_file_written_or_removed_after_a_read_is_seen(tree: Path) -> None:
    file_io = LocalFileIO(str(tree))
    path = f"{tree}/snapshot/snapshot-2"
    assert not file_exists(file_io, path) and read_text(file_io, path) is None
    (tree / "snapshot" / "snapshot-2").write_text("two")
    assert file_exists(file_io, path) and read_text(file_io, path) == "two"
    (tree / "snapshot" / "snapshot-2").unlink()
    assert not file_exists(file_io, path) and read_text(file_io, path) is None


def test_the_fuse_mapping_of_another_stores_paths_is_followed(tree: Path) -> None:
    file_io = FuseLocalFileIO("oss://bucket/warehouse", str(tree))
    assert read_text(file_io, "oss://bucket/warehouse/snapshot/snapshot-1") == \
        pypaimon_read(file_io, "oss://bucket/warehouse/snapshot/snapshot-1")
    assert file_exists(file_io, "oss://bucket/warehouse/a b/schema-0")
    assert not file_exists(file_io, "oss://bucket/warehouse/snapshot/snapshot-9")
    # A path outside the mapping is the file IO's to answer, as it is.
    assert file_exists(file_io, f"{tree}/snapshot/snapshot-1") == \
        file_io.exists(f"{tree}/snapshot/snapshot-1")


class AskedFileIO:
    """A file IO of another store: records what it is asked."""

    def __init__(self, present: set[str]) -> None:
        self.present, self.asked = present, list[str]()

    def exists(self, path: str) -> bool:
        self.asked.append(path)
        return path in self.present


def test_a_probe_of_a_directory_answers_as_pypaimons_exists(tree: Path) -> None:
    file_io = LocalFileIO(str(tree))
    for path in paths(tree):
        directory, _, name = path.rpartition("/")
        probe = FileProbe(file_io, directory)
        for _ in range(2):  # the second time from the translated directory
            assert probe.exists(name) == file_io.exists(path), path
    probe = FileProbe(file_io, f"file://{tree}/snapshot")
    assert not probe.exists("snapshot-2")
    (tree / "snapshot" / "snapshot-2").write_text("two")  # written after a probe: seen
    assert probe.exists("snapshot-2") and probe.exists("snapshot-1")
    (tree / "snapshot" / "snapshot-2").unlink()
    assert not probe.exists("snapshot-2")
    fuse = FileProbe(FuseLocalFileIO("oss://bucket/warehouse", str(tree)),
                     "oss://bucket/warehouse/snapshot")
    assert fuse.exists("snapshot-1") and not fuse.exists("snapshot-9")


def test_a_probe_of_a_plain_name_answers_as_exists(tree: Path) -> None:
    file_io = LocalFileIO(str(tree))
    probe = FileProbe(file_io, f"file://{tree}/snapshot")
    # First asked before the directory's translation is known, then after.
    assert probe.exists_plain("snapshot-1") and probe.exists_plain("snapshot-1")
    assert not probe.exists_plain("snapshot-2")
    (tree / "snapshot" / "snapshot-2").write_text("two")
    assert probe.exists_plain("snapshot-2") == probe.exists("snapshot-2") is True
    (tree / "snapshot" / "snapshot-2").unlink()
    assert probe.exists_plain("snapshot-2") == probe.exists("snapshot-2") is False
    (tree / "snapshot" / "LATEST").mkdir()  # a directory answers as a file does
    assert probe.exists_plain("LATEST") == file_io.exists(f"{tree}/snapshot/LATEST") is True


def test_a_probe_of_another_stores_directory_asks_the_store() -> None:
    file_io = AskedFileIO({"s3://b/t/snapshot/snapshot-1"})
    probe = FileProbe(file_io, "s3://b/t/snapshot")
    assert probe.exists("snapshot-1") and not probe.exists("snapshot-2")
    assert probe.exists_plain("snapshot-1") and not probe.exists_plain("snapshot-3")
    assert file_io.asked == ["s3://b/t/snapshot/snapshot-1", "s3://b/t/snapshot/snapshot-2",
                             "s3://b/t/snapshot/snapshot-1", "s3://b/t/snapshot/snapshot-3"]


def pypaimon_directories(file_io: LocalFileIO, path: str) -> list[str]:
    """The directories pypaimon's catalog finds in ``path`` (its list_tables' way)."""
    return sorted(s.base_name for s in file_io.list_status(path)
                  if s.type == pafs.FileType.Directory)


def test_local_directories_are_those_pypaimons_listing_finds(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    for name in ("orders", "items", ".hidden", "a b"):
        (db / name).mkdir(parents=True)
    (db / "file").write_text("not a table")
    (db / "link").symlink_to(db / "orders")  # a link to a directory: one
    (db / "broken").symlink_to(tmp_path / "nowhere")
    file_io = LocalFileIO(str(tmp_path))
    for path in (str(db), f"file://{db}", f"file:{db}"):
        # A name that is not plain: the store's own listing is asked.
        assert local_directories(file_io, path) is None
    (db / "a b").rmdir()
    for path in (str(db), f"file://{db}", f"file:{db}"):
        assert sorted(local_directories(file_io, path) or ()) == \
            pypaimon_directories(file_io, path) == [".hidden", "items", "link", "orders"]
    assert local_directories(file_io, str(tmp_path / "missing")) == \
        pypaimon_directories(file_io, str(tmp_path / "missing")) == []
    assert local_directories(AskedFileIO(set()), "s3://b/wh/shop.db") is None  # another store


def test_local_names_are_those_pypaimons_listing_finds(tmp_path: Path) -> None:
    """Every entry, files and directories alike (the consumer files' listing)."""
    consumer = tmp_path / "consumer"
    consumer.mkdir()
    for name in ("consumer-pg-g-shard-0", "consumer-flink", ".consumer-x.tmp"):
        (consumer / name).write_text("{}")
    (consumer / "sub").mkdir()
    file_io = LocalFileIO(str(tmp_path))
    for path in (str(consumer), f"file://{consumer}", f"file:{consumer}"):
        assert sorted(local_names(file_io, path) or ()) == \
            sorted(s.base_name for s in file_io.list_status(path))
    (consumer / "a b").write_text("{}")
    assert local_names(file_io, str(consumer)) is None  # not plain: the store's listing
    assert local_names(file_io, str(tmp_path / "missing")) == []
    assert local_names(AskedFileIO(set()), "s3://b/t/consumer") is None  # another store
