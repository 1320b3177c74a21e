"""Optional test requirements: missing in CI is a failure, elsewhere a skip."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require(module: str, hint: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError:
        message = f"{module} is needed: {hint}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
