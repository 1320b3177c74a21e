"""The import paths of before the packages (issue 26) keep working for one
release: each warns once, with a DeprecationWarning that points at the
importing line and names the new path, and gives the very objects of the new
path. ``paimon_group.spark`` stays public without a warning: the package
re-exports the names the module had. Each case runs in a fresh interpreter,
so that "once, at import" is what is measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.requirements import require

REPO = Path(__file__).resolve().parents[1]

_PROBE = """
import importlib, json, sys, warnings
old, new, names = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    exec(f"from {old} import {', '.join(names)}")  # the importing line: <string>
    exec(f"import {old}")                          # a second import warns no more
fresh = importlib.import_module(new)
same = all(getattr(sys.modules[old], n) is getattr(fresh, n) for n in names)
print(json.dumps({
    "same": same,
    "warnings": [(w.category.__name__, str(w.message), w.filename) for w in caught],
}))
"""


def probe(old: str, new: str, names: list[str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, old, new, ",".join(names)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


OLD_PATHS = [
    ("paimon_group.sinks", "paimon_group.spark.sinks",
     ["ParquetBatchSink", "EpochFence", "StaleSinkWrite", "batch_key_condition",
      "with_batch_key", "KEY_COLUMNS"]),
    ("paimon_group.config", "paimon_group.config.member",
     ["MemberConfig", "resolve_coordinator", "refuse_credentials_in_warehouse"]),
    ("paimon_group.member.facade", "paimon_group.member.group_member", ["GroupMember"]),
    ("paimon_group.member.reader", "paimon_group.member.read_loop", ["ReadLoop"]),
    ("paimon_group.member.driving", "paimon_group.member.host_reads",
     ["HostReads", "ShardPosition"]),
]


@pytest.mark.parametrize(("old", "new", "names"), OLD_PATHS, ids=[p[0] for p in OLD_PATHS])
def test_an_old_path_warns_once_and_gives_the_new_objects(
        old: str, new: str, names: list[str]) -> None:
    result = probe(old, new, names)
    assert result["same"] is True
    warned = result["warnings"]
    assert isinstance(warned, list)
    if old == "paimon_group.config":  # a package now: one warning per old name used
        assert len(warned) == len(names), warned
    else:
        assert len(warned) == 1, warned
    for category, message, filename in warned:
        assert category == "DeprecationWarning"
        assert f"{old}" in message and "0.2" in message and "paimon_group." in message
        assert filename == "<string>", "the warning must point at the importing line"


def test_the_old_source_paths_warn_once_and_give_the_new_modules() -> None:
    require("pyspark", "pip install '.[spark]' (tests/run.sh does)")
    result = probe("paimon_group.spark_source", "paimon_group.spark.source",
                   ["PaimonGroupDataSource", "PaimonGroupStreamReader", "SourceOptions"])
    assert result["same"] is True
    assert [w[0] for w in result["warnings"]] == ["DeprecationWarning"]  # type: ignore[union-attr]
    # The documented module of the sink: the same module object under both names.
    code = (
        "import warnings; warnings.simplefilter('ignore', DeprecationWarning)\n"
        "from paimon_group.spark_source.sink import write_replacing\n"
        "import paimon_group.spark.source.sink as new\n"
        "assert write_replacing is new.write_replacing\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)


def test_paimon_group_spark_keeps_its_names_without_a_warning() -> None:
    result = probe("paimon_group.spark", "paimon_group.spark.handler",
                   ["SparkBatchHandler", "SparkFunction", "ARROW_CONF", "arrow_to_dataframe",
                    "build_spark_session", "spark_handler_from_spec"])
    assert result == {"same": True, "warnings": []}


def test_the_data_source_is_the_one_of_the_source_package() -> None:
    require("pyspark", "pip install '.[spark]' (tests/run.sh does)")
    result = probe("paimon_group.spark", "paimon_group.spark.source", ["PaimonGroupDataSource"])
    assert result == {"same": True, "warnings": []}


def test_coordinators_base_warns_once_and_gives_the_objects_of_coordinators_protocol() -> None:
    names = ["Coordinator", "ConnectOptions", "Check", "Put", "Delete", "Entry", "Session",
             "SessionState", "Watch", "validate_key", "validate_dir"]
    result = probe("coordinators.base", "coordinators.protocol", names)
    assert result["same"] is True
    warned = result["warnings"]
    assert isinstance(warned, list) and len(warned) == 1, warned
    category, message, filename = warned[0]
    assert category == "DeprecationWarning"
    assert "coordinators.base" in message and "0.2" in message
    assert "coordinators.protocol" in message
    assert filename == "<string>", "the warning must point at the importing line"
