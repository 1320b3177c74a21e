"""The stop signals of a member's process: SIGTERM and SIGINT start a graceful leave.

One home for them: ``paimon-group run`` and :func:`~paimon_group.run_member`
(:mod:`paimon_group.process.runner`) and a library member used as
``async with GroupMember(config) as member:`` all install their handlers
through :class:`StopSignals`. A signal then calls the member's stop (release
the shards, leave the group) instead of ending the process: no handoff waits
for the session timeout, and the process exits 0.

A library member (``only_defaults=True``) takes a signal only while its
handler is the default one: ``SIG_DFL``, Python's ``default_int_handler``
for SIGINT, or the SIGINT handler of ``asyncio.run`` (which would cancel the
main task and end in a ``KeyboardInterrupt`` traceback, exit 130). A handler
of the user's own (``signal.signal``, ``loop.add_signal_handler``,
``SIG_IGN``) is left alone, and so is a loop outside the main thread of the
main interpreter (signals are delivered there only). The library members of
one loop share its handlers (:func:`subscribe`): a signal stops each of them,
and the previous handlers come back when the last one leaves.

Example::

    signals = StopSignals(asyncio.get_running_loop(), stop_event.set)
    signals.install()
    try:
        await stop_event.wait()
    finally:
        signals.restore()
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger("paimon_group.member")

STOP_SIGNALS: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)
"""What stops a member gracefully."""


def _is_asyncio_run_sigint(handler: Any) -> bool:
    """``asyncio.run``'s SIGINT handler (``Runner._on_sigint``, Python 3.11+)."""
    runner = getattr(asyncio, "Runner", None)
    on_sigint = getattr(runner, "_on_sigint", None)
    if on_sigint is None or not isinstance(handler, functools.partial):
        return False
    return getattr(handler.func, "__func__", None) is on_sigint


def is_default_handler(handler: Any) -> bool:
    """True for a handler nobody chose: the process's default for the signal."""
    return (handler is signal.SIG_DFL or handler is signal.default_int_handler
            or _is_asyncio_run_sigint(handler))


class StopSignals:
    """Loop handlers calling ``on_signal(signum)`` for ``signals`` (default:
    :data:`STOP_SIGNALS`); :meth:`restore` puts the previous ones back.

    ``only_defaults``: take a signal only while its handler is the default
    one (:func:`is_default_handler`); a library member's way. Without it (a
    process that owns its signals: the CLI's ``run``) every signal is taken.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, on_signal: Callable[[int], None],
                 signals: Iterable[int] = (), *, only_defaults: bool = True) -> None:
        self._loop = loop
        self._on_signal = on_signal
        self._signals = tuple(signals) or STOP_SIGNALS
        self._only_defaults = only_defaults
        self._previous: dict[int, Any] = {}

    @property
    def installed(self) -> tuple[int, ...]:
        """The signals taken (none outside the main thread, or all left to the user's)."""
        return tuple(self._previous)

    def install(self) -> tuple[int, ...]:
        """Take the signals; returns those taken. Without ``only_defaults`` a
        signal that cannot be taken (outside the main thread) raises, as
        ``loop.add_signal_handler`` does: a process runner that could not be
        stopped would run for ever."""
        if self._only_defaults and threading.current_thread() is not threading.main_thread():
            return ()
        for sig in self._signals:
            try:
                previous = signal.getsignal(sig)
                if self._only_defaults and not is_default_handler(previous):
                    continue
                self._loop.add_signal_handler(sig, self._on_signal, sig)
            except (ValueError, RuntimeError, NotImplementedError) as err:
                # Not the main interpreter, or a loop without signal support
                # (Windows): the signals keep their own handlers.
                if not self._only_defaults:
                    self.restore()
                    raise
                log.debug("signal %s left alone: %s", sig, err)
                continue
            self._previous[sig] = previous
        return self.installed

    def restore(self) -> None:
        """Put back the handlers found by :meth:`install`."""
        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            try:
                self._loop.remove_signal_handler(sig)
                if handler is not None:
                    signal.signal(sig, handler)
            except (ValueError, RuntimeError) as err:
                log.debug("signal %s not restored: %s", sig, err)


class _Subscribers:
    """The library members of one loop and the handlers they share."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.callbacks: list[Callable[[int], None]] = []
        self.signals = StopSignals(loop, self.dispatch)

    def dispatch(self, signum: int) -> None:
        for callback in list(self.callbacks):
            callback(signum)


_SUBSCRIBERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Subscribers] = (
    weakref.WeakKeyDictionary())


def subscribe(loop: asyncio.AbstractEventLoop,
              on_signal: Callable[[int], None]) -> Callable[[], None]:
    """Call ``on_signal(signum)`` on a stop signal, as long as the signals
    had their default handlers when the first subscriber of ``loop`` came;
    returns the unsubscribe, which restores them after the last one."""
    subscribers = _SUBSCRIBERS.get(loop)
    if subscribers is None:
        subscribers = _SUBSCRIBERS[loop] = _Subscribers(loop)
        subscribers.signals.install()
    subscribers.callbacks.append(on_signal)

    def unsubscribe() -> None:
        with contextlib.suppress(ValueError):
            subscribers.callbacks.remove(on_signal)
        if not subscribers.callbacks and _SUBSCRIBERS.get(loop) is subscribers:
            del _SUBSCRIBERS[loop]
            subscribers.signals.restore()

    return unsubscribe
