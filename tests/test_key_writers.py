"""Who writes the group's coordinator keys, measured: only
``paimon_group/protocol/`` (docs/design.md, "Who writes which keys"), and
no module keeps a process-wide mutable registry that members share.

A write is a call of the coordinator protocol's write methods
(:class:`~coordinators.protocol.Coordinator`'s ``create``, ``commit`` and
``delete``) on a coordinator: a receiver named ``coord``, ``coordinator``
(or ``_coord``, ``_coordinator``), or an attribute of that name. A guarded
commit needs the protocol's ``Check``, ``Put`` and ``Delete``, so importing
them counts as writing too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "paimon_group"
WRITERS = PACKAGE / "protocol"
WRITE_METHODS = frozenset({"create", "commit", "delete"})
COMMIT_PARTS = frozenset({"Check", "Put", "Delete", "Op"})
COORDINATOR_NAMES = frozenset({"coord", "coordinator", "_coord", "_coordinator"})
MUTATORS = frozenset({"add", "append", "clear", "discard", "extend", "insert", "pop",
                      "popitem", "remove", "setdefault", "update"})
MUTABLE_FACTORIES = frozenset({"dict", "set", "list", "defaultdict", "OrderedDict", "deque",
                               "Counter", "WeakKeyDictionary", "WeakValueDictionary",
                               "WeakSet"})
# Module-level mutable state that is the process's by nature, none of it a
# member's or a group's: what a process logs or warns once, the operating
# system's signal handlers, and clients of an object store by filesystem.
ALLOWED_PROCESS_STATE = {
    ("paimon_group/arrowread/levels.py", "_warned"): "a warning logged once per table",
    ("paimon_group/member/signals.py", "_SUBSCRIBERS"): "the process's signal handlers",
    ("paimon_group/store/exclusive.py", "_clients"): "an S3 client per filesystem",
    ("paimon_group/store/exclusive.py", "_honouring"): "stores known to honour a "
                                                        "conditional upload",
    ("paimon_group/store/files.py", "_LOCAL_DIRS"): "each local file IO's directories, "
                                                    "as it translates them",
}


def package_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _receiver_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def coordinator_writes(path: Path) -> list[str]:
    """``line: call`` of each coordinator write of ``path``, and each import
    of the parts of a guarded commit."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in WRITE_METHODS \
                and _receiver_name(node.func.value) in COORDINATOR_NAMES:
            found.append(f"{node.lineno}: {ast.unparse(node.func)}(...)")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("coordinators"):
            parts = sorted(a.name for a in node.names if a.name in COMMIT_PARTS)
            if parts:
                found.append(f"{node.lineno}: imports {', '.join(parts)}")
    return found


def _is_mutable(value: ast.expr) -> bool:
    if isinstance(value, ast.Dict | ast.Set | ast.List | ast.DictComp | ast.SetComp
                  | ast.ListComp):
        return True
    if isinstance(value, ast.Call):
        name = _receiver_name(value.func)
        return name in MUTABLE_FACTORIES
    return False


def _module_mutables(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and _is_mutable(node.value):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and node.value is not None \
                and _is_mutable(node.value) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _mutated(node: ast.AST, names: set[str]) -> str | None:
    """The module-level name ``node`` mutates, if it does."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in MUTATORS and isinstance(node.func.value, ast.Name) \
            and node.func.value.id in names:
        return node.func.value.id
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign | ast.Delete):
        targets = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    for target in targets:
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) \
                and target.value.id in names:
            return target.value.id
    return None


def mutable_registries(path: Path) -> set[str]:
    """Module-level dicts, sets and lists of ``path`` that a function mutates
    (a constant, never mutated, is not one)."""
    tree = ast.parse(path.read_text(), str(path))
    names = _module_mutables(tree)
    found: set[str] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                name = _mutated(node, names)
                if name is not None:
                    found.add(name)
    return found


def test_only_the_protocol_package_writes_group_keys() -> None:
    outside = {p.relative_to(REPO).as_posix(): coordinator_writes(p)
               for p in package_modules() if WRITERS not in p.parents}
    assert {path: calls for path, calls in outside.items() if calls} == {}


def test_the_protocol_package_is_where_the_writes_are() -> None:
    """The measure sees the writes where they are (else it would pass on nothing)."""
    writers = {p.relative_to(REPO).as_posix() for p in package_modules()
               if WRITERS in p.parents and coordinator_writes(p)}
    assert {"paimon_group/protocol/membership.py", "paimon_group/protocol/ownership.py",
            "paimon_group/protocol/admin.py",
            "paimon_group/protocol/table_head.py", "paimon_group/protocol/sinks.py",
            "paimon_group/protocol/group_start.py"} <= writers


@pytest.mark.parametrize("source", [
    "async def f(self):\n    await self._coord.commit([], [])\n",
    "async def f(group):\n    await group.coordinator.create('k', b'')\n",
    "async def f(coord):\n    await coord.delete('k')\n",
    "from coordinators.protocol import Check, Entry\n",
])
def test_the_writer_measure_finds_a_write(tmp_path: Path, source: str) -> None:
    module = tmp_path / "m.py"
    module.write_text(source)
    assert len(coordinator_writes(module)) == 1


def test_the_writer_measure_leaves_other_commits_alone(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("async def f(self, lane, table):\n"
                      "    await self._commits.commit({}, 1)\n    lane.commit(1)\n"
                      "    table.new_commit().commit([])\n"
                      "    entry = await self._coord.get('k')\n")
    assert coordinator_writes(module) == []


def test_no_module_keeps_a_mutable_registry() -> None:
    found = {(p.relative_to(REPO).as_posix(), name)
             for p in package_modules() for name in mutable_registries(p)}
    assert found - set(ALLOWED_PROCESS_STATE) == set()
    assert set(ALLOWED_PROCESS_STATE) - found == set(), "an allowed one is gone: drop it"


def test_the_registry_measure_tells_a_registry_from_a_constant(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("_known: dict[str, int] = {}\nNAMES = ('a',)\nKINDS = {'a': 1}\n"
                      "_seen = set()\n_log = []\n\n"
                      "def f(k):\n    _known[k] = 1\n    _seen.add(k)\n    return KINDS[k]\n")
    assert mutable_registries(module) == {"_known", "_seen"}
