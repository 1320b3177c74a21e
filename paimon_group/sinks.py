"""Deprecated path of :mod:`paimon_group.spark.sinks`, kept for one release (until 0.2).

Importing it warns once (DeprecationWarning) and gives the same objects as
the new path: ``from paimon_group.spark.sinks import ParquetBatchSink``.
"""

from __future__ import annotations

import warnings
from typing import Any

from paimon_group.spark import sinks as _sinks

__all__ = list(_sinks.__all__)

warnings.warn(
    "paimon_group.sinks is deprecated and goes in 0.2: import from paimon_group.spark.sinks",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    return getattr(_sinks, name)
