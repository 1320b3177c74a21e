"""Deprecated name of :mod:`coordinators.protocol`, kept for one release (until 0.2).

Importing it warns once (DeprecationWarning) and gives the very objects of
the new path: ``from coordinators.protocol import Coordinator``.
"""

from __future__ import annotations

import warnings
from typing import Any

from coordinators import protocol as _protocol

__all__ = [name for name in vars(_protocol) if not name.startswith("_")]

warnings.warn(
    "coordinators.base is deprecated and goes in 0.2: import from coordinators.protocol",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    return getattr(_protocol, name)
