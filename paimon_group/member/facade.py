"""Deprecated name of :mod:`paimon_group.member.group_member`, kept for one
release (until 0.2).

Importing it warns once (DeprecationWarning) and gives the very objects of
the new path: ``from paimon_group.member import GroupMember``.
"""

from __future__ import annotations

import warnings
from typing import Any

from paimon_group.member import group_member as _group_member

__all__ = [name for name in vars(_group_member) if not name.startswith("_")]

warnings.warn(
    "paimon_group.member.facade is deprecated and goes in 0.2: "
    "import from paimon_group.member.group_member",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    return getattr(_group_member, name)
