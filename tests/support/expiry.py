"""Snapshot expiry as Paimon's own does it, on a local table.

Paimon's ``ExpireSnapshotsImpl``, expiring the snapshots below ``keep_from``,
deletes their snapshot files and every file only they need: the data files
no retained snapshot holds (those the expired commits and the earliest
retained one deleted, e.g. the files a compaction rewrote), and the manifest
lists and manifest files no retained snapshot lists; then it writes the
EARLIEST hint. :func:`expire_like_paimon` does the same (pypaimon 2.1 cannot
expire), so that a reader holding anything of an expired snapshot (a plan, a
remembered snapshot text, a start) finds it gone, as it would in production.

Example::

    deleted = expire_like_paimon(warehouse, "db.t", keep_from=7)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from tests.support.tables import open_table

_METADATA_DIRS = {"snapshot", "manifest", "schema", "consumer", "index", "statistics", "tag",
                  "branch", "changelog"}


def _local(path: str) -> Path:
    parsed = urlparse(path)
    return Path(parsed.path if parsed.scheme in ("file", "") else path)


def _needed(table: Any, snapshots: list[Any]) -> tuple[set[str], set[str]]:
    """The data files and manifest (list) files the ``snapshots`` need."""
    from pypaimon.manifest.manifest_file_manager import ManifestFileManager
    from pypaimon.manifest.manifest_list_manager import ManifestListManager

    lists, files = ManifestListManager(table), ManifestFileManager(table)
    data: set[str] = set()
    manifests: set[str] = set()
    for snapshot in snapshots:
        for name in (snapshot.base_manifest_list, snapshot.delta_manifest_list,
                     snapshot.changelog_manifest_list, snapshot.index_manifest,
                     snapshot.statistics):
            if name:
                manifests.add(name)
        metas = lists.read_all(snapshot)
        changelog = lists.read_changelog(snapshot)
        manifests.update(m.file_name for m in metas + changelog)
        data.update(e.file.file_name for e in files.read_entries_parallel(metas))
        for meta in changelog:
            data.update(e.file.file_name for e in files.read(meta.file_name))
    return data, manifests


def expire_like_paimon(warehouse: str | os.PathLike[str], name: str, *,
                       keep_from: int) -> list[str]:
    """Expire every snapshot below ``keep_from`` with the files only they
    need (see the module docstring); the paths deleted."""
    table = open_table(warehouse, name)
    manager = table.snapshot_manager()
    latest = manager.get_latest_snapshot()
    if latest is None or keep_from > latest.id:
        raise ValueError(f"cannot expire up to {keep_from}: latest is {latest and latest.id}")
    retained = [manager.get_snapshot_by_id(i) for i in range(keep_from, latest.id + 1)]
    data, manifests = _needed(table, [s for s in retained if s is not None])
    root = _local(table.table_path)
    deleted: list[str] = []
    for snapshot_id in range(1, keep_from):
        path = _local(manager.get_snapshot_path(snapshot_id))
        if path.exists():
            path.unlink()
            deleted.append(str(path))
    for path in sorted((root / "manifest").glob("*")):
        if path.is_file() and path.name not in manifests:
            path.unlink()
            deleted.append(str(path))
    for directory, subdirs, names in os.walk(root):
        if Path(directory) == root:
            subdirs[:] = [d for d in subdirs if d not in _METADATA_DIRS]
        for file_name in names:
            if file_name.startswith(("data-", "changelog-")) and file_name not in data:
                (Path(directory) / file_name).unlink()
                deleted.append(str(Path(directory) / file_name))
    (root / "snapshot" / "EARLIEST").write_text(str(keep_from))
    return deleted
