"""What a member is told: its configuration, its columns, its warehouse.

* :mod:`paimon_group.config.member`: :class:`MemberConfig` and the coordinator
  a warehouse implies.
* :mod:`paimon_group.config.projection`: the columns a member reads.
* :mod:`paimon_group.config.warehouses`: which warehouse a URI names, and
  where its host-local coordinator lives.

``paimon_group.config`` was one module until 0.1; its names (``MemberConfig``,
``resolve_coordinator`` ...) still resolve here for one release (until 0.2),
with a DeprecationWarning. ``from paimon_group import MemberConfig`` is the
public path.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_warned: set[str] = set()


def __getattr__(name: str) -> Any:
    member = importlib.import_module("paimon_group.config.member")
    if name.startswith("__") or not hasattr(member, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _warned:  # once per name (an import asks twice: hasattr, then getattr)
        _warned.add(name)
        warnings.warn(
            f"paimon_group.config.{name} is deprecated and goes in 0.2: import it from "
            "paimon_group.config.member (MemberConfig: from paimon_group)",
            DeprecationWarning,
            stacklevel=2,
        )
    return getattr(member, name)
