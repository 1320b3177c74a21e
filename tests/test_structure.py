"""The shape of the code, measured: no module of ``paimon_group/`` or
``coordinators/`` is over 600 lines, and no function (a method, a nested
function) is over 60 lines from its ``def`` to its last line; the package
map that opens docs/design.md is the folder list, in the order of the
import-linter layers; the member's parts keep to their own state (each
piece has one owner: docs/design.md, "Who owns which state"), and
:class:`GroupMember` forwards few of its methods to its parts.

Ruff's complexity and statement rules (pyproject.toml) keep functions simple;
this keeps them short, which those rules do not measure.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("paimon_group", "coordinators")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60
# In paimon_group/member/: reads of another object's private names, and
# writes to them (none: a part changes another's state through a method).
MAX_FOREIGN_PRIVATE = 10
# GroupMember's methods that only forward to one of its pieces (its core or a
# part): its read-only views are declared as views of the core instead, so
# what is left are the public methods the API snapshot holds.
MAX_FORWARDS = 9


def modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def long_functions(path: Path) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function of ``path`` over the limit."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lines = (child.end_lineno or child.lineno) - child.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        found.append((name, lines))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(), str(path)), "")
    return found


def test_the_packages_have_modules() -> None:
    names = {p.relative_to(REPO).as_posix() for p in modules()}
    assert "paimon_group/protocol/group.py" in names and "coordinators/registry.py" in names


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_module_and_function_length(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{lines} lines (at most {MAX_MODULE_LINES})"
    assert long_functions(path) == [], f"functions over {MAX_FUNCTION_LINES} lines"


def test_the_measure_counts_from_def_to_last_line(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 1))
    short = tmp_path / "short.py"
    short.write_text(f"class A:\n  def f(self):\n{body}\n")
    assert long_functions(short) == []
    long = tmp_path / "long.py"
    long.write_text(f"class A:\n  async def f(self):\n{body}\n    y = 0\n")
    assert long_functions(long) == [("A.f", MAX_FUNCTION_LINES + 1)]


def package_map() -> list[str]:
    """The paths listed, in order, by the first section of docs/design.md."""
    first = (REPO / "docs" / "design.md").read_text().split("\n## ")[1]
    assert first.startswith("Packages\n"), "docs/design.md must open with the package map"
    return re.findall(r"^- `([^`]+)`: ", first, re.MULTILINE)


def top_level() -> set[str]:
    """``paimon_group/``'s modules and packages, and ``coordinators/``."""
    root = REPO / "paimon_group"
    found = {f"paimon_group/{p.name}" for p in root.glob("*.py")}
    found |= {f"paimon_group/{p.name}/" for p in root.iterdir() if (p / "__init__.py").exists()}
    return found | {"coordinators/"}


def test_the_package_map_is_the_folder_list() -> None:
    listed = package_map()
    assert len(listed) == len(set(listed)), "a path listed twice"
    assert set(listed) == top_level()


def test_the_package_map_is_in_the_order_of_the_layers() -> None:
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c["layers"] for c in contracts["contracts"]
                  if c.get("containers") == ["paimon_group"])
    names = [n.strip(" ()") for layer in layers for n in layer.split("|")]
    listed = [p.removeprefix("paimon_group/").removesuffix("/").removesuffix(".py")
              for p in package_map() if p.startswith("paimon_group/")]
    assert [n for n in listed if n in names] == names


def foreign_private(paths: list[Path]) -> tuple[list[str], list[str]]:
    """Each use of another object's private name (``x._name``, where ``x`` is
    not ``self`` or ``cls``; dunders aside) in ``paths``, and those of them
    that assign it, as ``file:line name``."""
    uses: list[str] = []
    writes: list[str] = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            shown = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name
            where = f"{shown}:{node.lineno} {node.attr}"
            uses.append(where)
            if isinstance(node.ctx, ast.Store):
                writes.append(where)
    return uses, writes


def test_the_member_parts_keep_to_their_own_state() -> None:
    uses, writes = foreign_private(sorted((REPO / "paimon_group" / "member").glob("*.py")))
    assert writes == [], "a part writes another object's private state"
    assert len(uses) <= MAX_FOREIGN_PRIVATE, uses


def test_the_ownership_measure_counts_reads_and_writes(tmp_path: Path) -> None:
    part = tmp_path / "part.py"
    part.write_text("class P:\n  def f(self, core):\n"
                    "    self._own = core._theirs\n    core._theirs = 1\n"
                    "    return core.__class__, cls._x\n")
    uses, writes = foreign_private([part])
    assert sorted(uses) == ["part.py:3 _theirs", "part.py:4 _theirs"]
    assert writes == ["part.py:4 _theirs"]


HISTORY = re.compile(r"\bseeds? \d{2,}|\b[Ii]ssue \d+|\bwave \d\b")


def test_the_code_s_comments_tell_no_history() -> None:
    """Comments and docstrings say what the code guarantees and why; which
    simulation seed or issue found it belongs in docs/reliability.md."""
    found = [f"{p.relative_to(REPO).as_posix()}:{n}: {line.strip()}"
             for p in modules() for n, line in enumerate(p.read_text().splitlines(), 1)
             if HISTORY.search(line)]
    assert found == [], "\n".join(found)


def _forward_target(node: ast.expr) -> bool:
    """Whether ``node`` is ``self.<piece>.<name>`` (deeper too), called or
    read, awaited or not."""
    if isinstance(node, ast.Await):
        node = node.value
    if isinstance(node, ast.Call):
        node = node.func
    depth = 0
    while isinstance(node, ast.Attribute):
        node, depth = node.value, depth + 1
    return isinstance(node, ast.Name) and node.id == "self" and depth >= 2


def forwards(path: Path, cls: str) -> list[str]:
    """The methods of class ``cls`` in ``path`` (properties included) whose
    body, past a docstring, is one return or call of ``self.<piece>.<name>``:
    a one-line forward to one of its pieces (``self._core``, a part)."""
    tree = ast.parse(path.read_text(), str(path))
    [found] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    out: list[str] = []
    for fn in found.body:
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        body = fn.body
        if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            body = body[1:]
        if (len(body) == 1 and isinstance(body[0], ast.Return | ast.Expr)
                and body[0].value is not None and _forward_target(body[0].value)):
            out.append(fn.name)
    return out


def test_the_group_member_forwards_few_methods() -> None:
    found = forwards(REPO / "paimon_group" / "member" / "group_member.py", "GroupMember")
    assert len(found) <= MAX_FORWARDS, found


def test_the_forward_measure(tmp_path: Path) -> None:
    part = tmp_path / "part.py"
    part.write_text(
        "class M:\n"
        "  @property\n  def a(self):\n    return self._core.a\n"
        "  def b(self, x):\n    \"\"\"Doc.\"\"\"\n    return self._core.b(x)\n"
        "  async def c(self):\n    return await self.part.c()\n"
        "  def d(self):\n    self._core.d()\n"
        "  def e(self):\n    return self.e_value\n"
        "  def f(self):\n    x = self._core.f()\n    return x\n"
        "  def g(self):\n    return {s: o for s, o in self._core.owned.items()}\n")
    assert forwards(part, "M") == ["a", "b", "c", "d"]
