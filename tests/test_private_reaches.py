"""The tests reach into the project's private names at most
``MAX_PRIVATE_REACHES`` times in all. A reach is an attribute access
``x._name`` where ``x`` is not ``self``, ``cls`` or ``super()`` (dunders
aside), in any Python file under ``tests/``.

Why a limit: tests go through the public API or a documented seam (the
member's ``core``, its parts, the read-only views the code's own parts use:
docs/testing.md, "Private names"), so that the code's insides can change
without rewriting the tests that pin its behaviour, and the few tests that
must reach inside (to make a race happen, to break one step) stand out.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_PRIVATE_REACHES = 50
# Private names of other projects, reached on purpose: they are not this
# project's insides, so they do not count (by name: none of them is a name of
# paimon_group, coordinators or the tests' own helpers).
OTHER_PROJECTS = {
    "_exit": "os: a child process ends without the parent's cleanup",
    "_getframe": "sys: the module of a caller",
    "_gateway": "paimon_python_java (Paimon's engine): its gateway, reset after a shutdown",
    "_j_catalog": "paimon_python_java: the engine's Java catalog",
    "_j_table": "paimon_python_java: the engine's Java table",
    "_arrow_schema": "paimon_python_java: the schema the engine writes with",
    "_try_commit": "pypaimon: one commit of prepared files, at a chosen snapshot",
    "_align_array_by_id": "pypaimon: its own alignment, which the Arrow reader matches",
    "_create_from_arrow_table": "PySpark: its conversion, observed",
}


def private_reaches(paths: list[Path]) -> list[str]:
    """Each reach into a private name in ``paths`` (see the module
    docstring), names of :data:`OTHER_PROJECTS` aside, as ``file:line x._name``."""
    found: list[str] = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if (isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name)
                    and owner.func.id == "super"):
                continue
            if node.attr in OTHER_PROJECTS:
                continue
            shown = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name
            found.append(f"{shown}:{node.lineno} {ast.unparse(owner)}.{node.attr}")
    return found


def test_the_tests_reach_few_private_names() -> None:
    found = private_reaches(sorted((REPO / "tests").rglob("*.py")))
    assert len(found) <= MAX_PRIVATE_REACHES, "\n".join(found)


def test_the_measure_counts_reaches_of_other_objects(tmp_path: Path) -> None:
    test = tmp_path / "test_x.py"
    test.write_text(
        "import os\n"
        "class T(Base):\n"
        "  def f(self, member):\n"
        "    member._core.owned = self._own\n"
        "    x = member.core._gate\n"
        "    super()._commit(), cls._x, member.__class__, os._exit(0)\n"
        "    return make()._part, 'member._core'\n")
    assert sorted(private_reaches([test])) == [
        "test_x.py:4 member._core", "test_x.py:5 member.core._gate", "test_x.py:7 make()._part"]
