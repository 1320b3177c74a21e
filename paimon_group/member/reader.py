"""Deprecated name of :mod:`paimon_group.member.read_loop`, kept for one
release (until 0.2).

Importing it warns once (DeprecationWarning) and gives the very objects of
the new path.
"""

from __future__ import annotations

import warnings
from typing import Any

from paimon_group.member import read_loop as _new

_RENAMED: dict[str, str] = {}
__all__ = [name for name in vars(_new) if not name.startswith("_")]

warnings.warn(
    "paimon_group.member.reader is deprecated and goes in 0.2: "
    "import from paimon_group.member.read_loop",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    return getattr(_new, _RENAMED.get(name, name))
