"""Deprecated path of :mod:`paimon_group.spark.source`, kept for one release (until 0.2).

Importing it warns once (DeprecationWarning) and gives the same objects as
the new path, its modules included (``paimon_group.spark_source.sink`` is
``paimon_group.spark.source.sink``). As before, it needs PySpark >= 4.2 and
says so in one ConfigError line on an older one.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import Any

from paimon_group.spark import source as _source

_MODULES = ("driver", "errors", "offsets", "options", "sink", "source")

__all__ = list(_source.__all__)

# The old module paths name the new modules: one module object each, so a
# class has one identity whichever path imported it.
for _name in _MODULES:
    sys.modules[f"{__name__}.{_name}"] = importlib.import_module(f"{_source.__name__}.{_name}")

warnings.warn(
    "paimon_group.spark_source is deprecated and goes in 0.2: import from paimon_group.spark "
    "(PaimonGroupDataSource) or paimon_group.spark.source",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return sys.modules[f"{__name__}.{name}"]
    return getattr(_source, name)
