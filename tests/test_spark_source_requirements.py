"""The Spark source needs PySpark >= 4.2 (admission control for Python
streaming sources); on an older PySpark, importing it says so in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Runs in a fresh interpreter: PySpark as it is here, minus the module that
# Spark 4.2 added (as on PySpark 4.0 and 4.1).
_WITHOUT_ADMISSION_CONTROL = """
import sys
from importlib.abc import MetaPathFinder

class Spark41(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "pyspark.sql.streaming.datasource":
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, Spark41())
from coordinators.errors import ConfigError
try:
    import paimon_group.spark.source
except ConfigError as err:
    print(err)
    sys.exit(3)
print("imported")
"""


def test_an_older_pyspark_is_named_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_ADMISSION_CONTROL],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    import pyspark

    line = done.stdout.strip()
    assert "\n" not in line
    assert line == (
        "the paimon-group Spark source needs PySpark >= 4.2 (admission control for Python "
        f"streaming sources); this is PySpark {pyspark.__version__}: upgrade it, or use "
        "--spark-handler workers, which run on PySpark 4.0 and later"
    )


def test_the_installed_pyspark_imports_the_source() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import paimon_group.spark.source; print('imported')"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "imported"


def test_the_spark_extra_asks_for_the_pyspark_the_source_needs() -> None:
    """``pip install '.[spark]'`` must give a PySpark on which everything of ours
    works, the stream source included."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.version import Version

    from paimon_group.spark.source import MIN_PYSPARK

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pyspark = next(Requirement(r) for r in project["optional-dependencies"]["spark"]
                   if Requirement(r).name == "pyspark")
    lowest = min(Version(s.version) for s in pyspark.specifier if s.operator == ">=")
    assert lowest == Version(MIN_PYSPARK), str(pyspark)
