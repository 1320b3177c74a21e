"""pyproject.toml asks for what pypaimon needs and names the Pythons it runs on.

* the pyarrow range is pypaimon's own (the installed pypaimon's metadata): a
  wider one made every install resolve the newest pyarrow first and then
  fall back to the one pypaimon accepts;
* ``requires-python`` admits exactly the Python versions the classifiers
  list, and README.md names the same ones (on a later Python the pyarrow
  pypaimon needs has no wheel).
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
CLASSIFIER = re.compile(r"^Programming Language :: Python :: (3\.\d+)$")
SUPPORTED = ["3.11", "3.12", "3.13"]


def supported_pythons() -> list[str]:
    """The ``3.N`` versions of the classifiers, in order."""
    return [m.group(1) for c in PROJECT.get("classifiers", []) if (m := CLASSIFIER.match(c))]


def ours(name: str) -> Requirement:
    return next(Requirement(r) for r in PROJECT["dependencies"] if Requirement(r).name == name)


def pypaimons(name: str, python: str) -> SpecifierSet:
    """The range of ``name`` the installed pypaimon requires on ``python``."""
    found = [Requirement(r) for r in importlib.metadata.requires("pypaimon") or []]
    applying = [r.specifier for r in found if r.name == name and (
        r.marker is None or r.marker.evaluate({"python_version": python, "extra": ""}))]
    assert len(applying) == 1, (name, python, applying)
    return applying[0]


def test_pyarrow_is_asked_in_the_range_pypaimon_needs() -> None:
    for python in SUPPORTED:
        assert ours("pyarrow").specifier == pypaimons("pyarrow", python), python


def test_requires_python_admits_exactly_the_classified_versions() -> None:
    pythons = supported_pythons()
    assert pythons == SUPPORTED
    requires = SpecifierSet(PROJECT["requires-python"])
    for minor in range(6, 20):
        version = f"3.{minor}"
        assert (f"{version}.0" in requires) == (version in pythons), (version, str(requires))


def test_the_readme_names_the_supported_pythons() -> None:
    readme = (REPO / "README.md").read_text()
    assert f"Python {SUPPORTED[0]} to {SUPPORTED[-1]}" in readme
