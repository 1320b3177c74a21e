"""Deprecated name of :mod:`paimon_group.member.host_reads`, kept for one
release (until 0.2).

Importing it warns once (DeprecationWarning) and gives the very objects of
the new path (``Driving`` is now ``HostReads``).
"""

from __future__ import annotations

import warnings
from typing import Any

from paimon_group.member import host_reads as _new

_RENAMED: dict[str, str] = {"Driving": "HostReads"}
__all__ = [name for name in vars(_new) if not name.startswith("_")] + list(_RENAMED)

warnings.warn(
    "paimon_group.member.driving is deprecated and goes in 0.2: "
    "import from paimon_group.member.host_reads",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    return getattr(_new, _RENAMED.get(name, name))
