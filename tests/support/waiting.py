"""The suite's polling helpers: tests wait for behaviour with generous limits
and never assert timings (the machines running the suite are shared and noisy).

``wait_for`` polls from a thread (processes, Spark queries); ``eventually``
polls from a coroutine, its probe a function or a coroutine function. Both
return the first truthy result and fail with what they waited for.
"""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")

LIMIT_S = 60.0


def wait_for(
    what: str,
    check: Callable[[], Any],
    timeout: float = 120.0,
    alive: Mapping[str, subprocess.Popen[Any]] | None = None,
    *,
    query: Any = None,
    every_s: float = 0.1,
) -> Any:
    """The first truthy ``check()``, polled every ``every_s``; fails after
    ``timeout``, or at once when a process of ``alive`` exits or the Spark
    streaming ``query`` failed."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        for name, proc in (alive or {}).items():
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode} while waiting "
                                     f"for {what}")
        if query is not None and query.exception() is not None:
            raise AssertionError(f"query failed while waiting for {what}: {query.exception()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every_s)


async def eventually(
    probe: Callable[[], T | Awaitable[T]], what: str = "a condition", limit_s: float = LIMIT_S,
    every_s: float = 0.05,
) -> T:
    """The first truthy result of ``probe()`` (awaited if it is awaitable);
    fails after ``limit_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while True:
        result = probe()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result  # type: ignore[return-value]
        if loop.time() > deadline:
            raise AssertionError(f"not within {limit_s}s: {what}")
        await asyncio.sleep(every_s)
