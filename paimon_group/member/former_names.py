"""The former module names of the member's parts, served for one release
(until 0.2) without a file of their own.

``paimon_group.member.facade``, ``.reader`` and ``.driving`` are now
``group_member``, ``read_loop`` and ``host_reads``. Importing a former name
warns once (DeprecationWarning, pointing at the importing line) and gives a
module holding the very objects of the new one; ``Driving`` is ``HostReads``.
The finder is installed by ``paimon_group.member`` and answers for these three
names only, after Python's own finders found no file.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

# Former module -> (its new module, the former names of renamed objects).
FORMER: dict[str, tuple[str, dict[str, str]]] = {
    "paimon_group.member.facade": ("paimon_group.member.group_member", {}),
    "paimon_group.member.reader": ("paimon_group.member.read_loop", {}),
    "paimon_group.member.driving": ("paimon_group.member.host_reads", {"Driving": "HostReads"}),
}


class FormerNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and loads the former names of :data:`FORMER`."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in FORMER:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: ModuleSpec) -> None:
        return None  # the default module

    def exec_module(self, module: ModuleType) -> None:
        new, renamed = FORMER[module.__name__]
        target = importlib.import_module(new)
        # stacklevel 2: the frame after this one that is not the import
        # machinery's (warnings skips those), i.e. the importing line.
        warnings.warn(f"{module.__name__} is deprecated and goes in 0.2: import from {new}",
                      DeprecationWarning, stacklevel=2)
        names = [n for n in vars(target) if not n.startswith("_")]
        for name in names:
            setattr(module, name, getattr(target, name))
        for former, name in renamed.items():
            setattr(module, former, getattr(target, name))
        module.__dict__["__all__"] = [*names, *renamed]


def install() -> None:
    """Serve the former names (once per interpreter)."""
    if not any(isinstance(finder, FormerNames) for finder in sys.meta_path):
        sys.meta_path.append(FormerNames())
