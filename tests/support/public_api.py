"""The public API as data: every name of ``paimon_group.__all__`` and, for a
class, its public members (a method by its signature, anything else as
"data"; :class:`GroupMember`'s as an instance shows them). The snapshot in
``public_api.json`` was taken on the release before the member's parts got
one owner each; tests/test_public_api.py compares with it."""

from __future__ import annotations

import enum
import inspect
from typing import Any

import paimon_group


def _kind(owner: type, name: str) -> str:
    found = inspect.getattr_static(owner, name, None)
    if isinstance(found, (staticmethod, classmethod)):
        found = found.__func__
    if inspect.isfunction(found):
        return "method" + str(inspect.signature(found))
    return "data"


def _members(cls: type, obj: object | None = None) -> dict[str, str]:
    names = {n for n in dir(cls) if not n.startswith("_")}
    if obj is not None:
        names |= {n for n in dir(obj) if not n.startswith("_")}
    return {n: _kind(cls, n) for n in sorted(names)}


def public_api() -> dict[str, Any]:
    """The public API of the installed ``paimon_group``, as data."""
    out: dict[str, Any] = {}
    for name in sorted(paimon_group.__all__):
        obj = getattr(paimon_group, name)
        if inspect.isclass(obj) and issubclass(obj, enum.Enum):
            out[name] = {"enum": sorted(m.name for m in obj)}
        elif inspect.isclass(obj):
            instance = None
            if name == "GroupMember":
                instance = obj(paimon_group.MemberConfig(
                    group="g", warehouse="/tmp/x", table="db.t",
                    coordinator="memory://api-snapshot", member_id="a"))
            init = str(inspect.signature(obj.__init__)) if "__init__" in vars(obj) else ""
            out[name] = {"init": init, "members": _members(obj, instance)}
        elif callable(obj):
            out[name] = {"function": str(inspect.signature(obj))}
        else:
            out[name] = {"value": type(obj).__name__}
    return out
