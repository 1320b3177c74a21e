"""The import paths of the packages: ``paimon_group.spark`` re-exports the
names the module had, without a warning; the paths that went in 0.2 (the old
paths of before the packages, and the member's former module names) are
gone. Each case runs in a fresh interpreter, so that nothing imported
earlier by the test session is measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.requirements import require

REPO = Path(__file__).resolve().parents[1]

_PROBE = """
import importlib, json, sys, warnings
old, new, names = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    exec(f"from {old} import {', '.join(names)}")
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


def test_paimon_group_spark_keeps_its_names_without_a_warning() -> None:
    result = probe("paimon_group.spark", "paimon_group.spark.handler",
                   ["SparkBatchHandler", "SparkFunction", "ARROW_CONF", "arrow_to_dataframe",
                    "build_spark_session", "spark_handler_from_spec"])
    assert result == {"same": True, "warnings": []}


def test_the_data_source_is_the_one_of_the_source_package() -> None:
    require("pyspark", "pip install '.[spark]' (tests/run.sh does)")
    result = probe("paimon_group.spark", "paimon_group.spark.source", ["PaimonGroupDataSource"])
    assert result == {"same": True, "warnings": []}


# The module paths removed in 0.2, each with the path that replaced it
# (CHANGELOG.md).
REMOVED_MODULES = [
    "paimon_group.sinks",              # paimon_group.spark.sinks
    "paimon_group.spark_source",       # paimon_group.spark.source
    "coordinators.base",               # coordinators.protocol
    "paimon_group.member.facade",      # paimon_group.member.group_member
    "paimon_group.member.reader",      # paimon_group.member.read_loop
    "paimon_group.member.driving",     # paimon_group.member.host_reads
]


def test_the_paths_removed_in_0_2_are_gone() -> None:
    """No file serves them, and importing the packages installs no import
    finder (the member's former names were served by one). Checked on the
    tree rather than by importing them: an editable install of another
    checkout may still serve its own files under these names."""
    for old in REMOVED_MODULES:
        path = REPO.joinpath(*old.split("."))
        assert not path.with_suffix(".py").exists() and not path.is_dir(), old
    code = ("import sys; before = list(sys.meta_path)\n"
            "import paimon_group.member, paimon_group.spark, paimon_group.config, coordinators\n"
            "print([type(f).__name__ for f in sys.meta_path if f not in before\n"
            "       and type(f).__module__.startswith(('paimon_group', 'coordinators'))])\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"


def test_paimon_group_config_no_longer_serves_the_names_of_its_member_module() -> None:
    import paimon_group.config

    assert not hasattr(paimon_group.config, "MemberConfig")
    assert not hasattr(paimon_group.config, "resolve_coordinator")
