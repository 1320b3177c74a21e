"""Loading user handlers given as ``MODULE:CALLABLE``.

``MODULE`` is imported with the current directory first on ``sys.path`` (as
``python -m`` would), so a handler file next to where ``paimon-group run`` is
started is found. Errors are one line (:class:`HandlerImportError`).

Example::

    >>> fn = load_callable("json:dumps", what="handler")
    >>> fn([1])
    '[1]'
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from paimon_group.errors import HandlerImportError


def load_callable(spec: str, *, what: str = "handler") -> Callable[..., Any]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise HandlerImportError(f"{what} {spec!r} must be MODULE:CALLABLE, e.g. my_jobs:handle")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # any import-time error of user code is bad input
        raise HandlerImportError(
            f"cannot import {what} module {module_name!r}: {type(err).__name__}: {err}"
        ) from err
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as err:
            raise HandlerImportError(
                f"{what} {spec!r}: module {module_name!r} has no attribute {attr!r}"
            ) from err
    if not callable(target):
        raise HandlerImportError(f"{what} {spec!r} is not callable")
    return target  # type: ignore[no-any-return]
