"""Importing paimon_group and coordinators changes no pypaimon class.

The changes that make pypaimon's reader read as the engine reads are made by
one call, :func:`paimon_group.reading.engine_reads.install_engine_reads`,
when a group table is opened; importing a module makes none of them. This
is checked in a fresh interpreter: every class of every pypaimon module
that imports there is recorded (the objects of its ``__dict__``), then every
module of ``paimon_group`` and ``coordinators`` is imported, then the
classes are compared, entry by entry, by identity.

Opening a group table makes the changes, exactly those, once: a second
opening, or installations racing on several threads, change nothing more.

A module of ours is skipped only when its import fails for want of one of
the optional dependencies in ``OPTIONAL`` (PySpark for the Spark pieces,
boto3 for S3 commits, kazoo and aetcd for the ZooKeeper and etcd
backends); the test says which it skipped. Any other failure to import
fails the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OPTIONAL = ("pyspark", "boto3", "kazoo", "aetcd")

_SCRIPT = r"""
import importlib, json, pkgutil, sys, warnings

warnings.simplefilter("ignore")
OPTIONAL = set(sys.argv[1].split(","))


def walk(package):
    pkg = importlib.import_module(package)
    for info in pkgutil.walk_packages(pkg.__path__, package + "."):
        yield info.name


classes = {}
for name in walk("pypaimon"):
    try:
        module = importlib.import_module(name)
    except BaseException:
        continue
    for value in list(vars(module).values()):
        if isinstance(value, type) and value.__module__ == name:
            # The objects themselves are kept, so that no id is reused.
            classes[f"{name}.{value.__qualname__}"] = (value, dict(vars(value)))

skipped, failed = {}, {}
for package in ("coordinators", "paimon_group"):
    for name in [package, *walk(package)]:
        if name.endswith(".__main__"):
            continue
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            if (err.name or "").split(".")[0] in OPTIONAL:
                skipped[name] = err.name
            else:
                failed[name] = repr(err)
        except BaseException as err:
            failed[name] = repr(err)

changed = {}
for qualname, (cls, before) in classes.items():
    after = dict(vars(cls))
    diff = sorted(
        key for key in set(before) | set(after)
        if key not in before or key not in after or before[key] is not after[key]
    )
    if diff:
        changed[qualname] = diff
print(json.dumps({"classes": len(classes), "skipped": skipped, "failed": failed,
                  "changed": changed}))
"""


def _in_a_fresh_interpreter(script: str, *args: str) -> dict[str, object]:
    """The JSON document the last line of ``script``'s output is, run in a
    new interpreter on this checkout."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PAIMON_GROUP_ARROW_READER", None)
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_importing_every_module_changes_no_pypaimon_class() -> None:
    result = _in_a_fresh_interpreter(_SCRIPT, ",".join(OPTIONAL))
    assert isinstance(result["classes"], int) and result["classes"] > 100
    assert result["failed"] == {}, result["failed"]
    if result["skipped"]:
        print("skipped, an optional dependency absent:", result["skipped"])
    assert result["changed"] == {}, f"changed at import: {result['changed']}"


_OPEN_SCRIPT = r"""
import json, sys, threading

from pypaimon.manifest.manifest_file_manager import ManifestFileManager
from pypaimon.read.reader.format_pyarrow_reader import FormatPyArrowReader
from pypaimon.read.reader.iface.record_batch_reader import RecordBatchReader
from pypaimon.read.split_read import MergeFileSplitRead

from paimon_group.reading.engine_reads import install_engine_reads
from paimon_group.reading.table import ShardedTable
from tests.support.tables import make_pk_table

CLASSES = (ManifestFileManager, FormatPyArrowReader, RecordBatchReader, MergeFileSplitRead)


def state():
    return {cls.__name__: dict(vars(cls)) for cls in CLASSES}


def changed(before, after):
    return sorted(
        f"{name}.{key}" for name in before
        for key in set(before[name]) | set(after[name])
        if before[name].get(key) is not after[name].get(key)
    )


def wrappers(method):
    # How many of our replacements ``method`` is, one inside the other.
    depth = 0
    while getattr(method, "_engine_reads", None):
        depth += 1
        cells = dict(zip(method.__code__.co_freevars, method.__closure__ or ()))
        method = cells["original"].cell_contents
    return depth


make_pk_table(sys.argv[1])
pristine = state()
ShardedTable.open(sys.argv[1], "db.t")
opened = state()
threads = [threading.Thread(target=install_engine_reads) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
ShardedTable.open(sys.argv[1], "db.t")
print(json.dumps({
    "at_open": changed(pristine, opened),
    "after": changed(opened, state()),
    "post_process_wrappers": wrappers(FormatPyArrowReader.__dict__["_post_process_batch"]),
}))
"""


def test_opening_a_table_installs_the_engine_reads_once(tmp_path: Path) -> None:
    result = _in_a_fresh_interpreter(_OPEN_SCRIPT, str(tmp_path / "wh"))
    assert result["at_open"] == [
        "FormatPyArrowReader._post_process_batch",
        "ManifestFileManager._get_value_stats_fields",
        "RecordBatchReader._iter_df_rows",
    ]
    assert result["after"] == []
    assert result["post_process_wrappers"] == 2  # CHAR from ORC, ROWs from Parquet
