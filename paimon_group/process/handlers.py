"""Loading user handlers given as ``MODULE:CALLABLE``.

``MODULE`` is imported with the current directory first on ``sys.path`` (as
``python -m`` would), so a handler file next to where ``paimon-group run`` is
started is found, and so are the modules and the package it imports while it
is imported. The directory is taken off the path again once the import is
over (failed or not): a module imported later, by the handler or by a
library (``import timeit`` inside the handler, an optional dependency probed
on first use), is never taken from a file that someone put in the working
directory. A handler that imports a sibling module lazily, inside a function,
imports it at the top instead, is a package (its submodules stay importable:
the package remembers its own directory), or is installed (``pip install``,
``PYTHONPATH``). A directory that was on the path already (``PYTHONPATH``,
``python -m paimon_group``, which puts the current directory first itself)
stays there. Errors are one line (:class:`HandlerImportError`).

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
from types import ModuleType
from typing import Any

from paimon_group.errors import HandlerImportError


def load_callable(spec: str, *, what: str = "handler") -> Callable[..., Any]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise HandlerImportError(f"{what} {spec!r} must be MODULE:CALLABLE, e.g. my_jobs:handle")
    module = _import_from_working_directory(module_name, what)
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


def _import_from_working_directory(module_name: str, what: str) -> ModuleType:
    """``module_name`` imported with the working directory first on the path
    for this import only (module docstring)."""
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except Exception as err:  # any import-time error of user code is bad input
        raise HandlerImportError(
            f"cannot import {what} module {module_name!r}: {type(err).__name__}: {err}"
        ) from err
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)
