"""The one error hierarchy of paimon-group.

Every error we raise derives from :class:`PaimonGroupError`. Its ``retriable``
flag tells callers (and the tenacity policies in :mod:`coordinators.retry`)
whether trying the same operation again may succeed. Backend exceptions are
translated in one place per backend, always with ``raise ... from err``, so a
``kazoo``, ``grpc`` or ``sqlite3`` exception never escapes a coordinator: each
backend declares one :class:`ErrorTranslation` (which exceptions it catches,
and the function that maps them), and wraps its calls with it, as a decorator
or a ``with`` block.

Messages are one line, say what to do, and never contain a credential.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any, Final, TypeVar, cast


class PaimonGroupError(Exception):
    """Root of every error raised by paimon-group."""

    retriable: bool = False

    def __init__(self, message: str, *, retriable: bool | None = None) -> None:
        super().__init__(message)
        if retriable is not None:
            self.retriable = retriable


class ConfigError(PaimonGroupError):
    """Bad input from the user: a malformed URL, a bad name, a bad option."""


class CoordinatorError(PaimonGroupError):
    """Base for errors raised by a coordinator backend."""


class InvalidCoordinatorURL(ConfigError, CoordinatorError):
    """The coordinator URL cannot be parsed or names an unknown scheme."""


class CoordinatorUnavailable(CoordinatorError):
    """The coordinator cannot be reached right now (server down, timeout)."""

    retriable = True


class AuthenticationFailed(CoordinatorError):
    """The coordinator refused our credentials or our TLS handshake failed."""


class SessionLost(CoordinatorError):
    """The session has ended (expired or closed); its ephemeral keys are gone.

    A lost session is never silently replaced: the owner of the coordinator
    must open a new one, re-register and re-acquire whatever it owned.
    """


class SessionSuspended(CoordinatorError):
    """The session may still be alive but cannot be confirmed right now."""

    retriable = True


class RequestTooLarge(CoordinatorError):
    """A write bigger than the coordinator accepts in one request: refused before
    it is sent, and no retry sends it (a server that takes it is configured
    otherwise; the value must shrink or be split)."""


class CorruptValue(CoordinatorError):
    """A value stored in the coordinator cannot be decoded."""


Translate = Callable[[BaseException, str], PaimonGroupError]
F = TypeVar("F", bound=Callable[..., Any])


class ErrorTranslation:
    """How one backend's exceptions become ours: which ones, and the mapping.

    Our own errors pass through unchanged; any other exception of a type in
    ``catch`` leaves as ``translate(err, what)``, raised ``from err``.

    Example::

        import sqlite3
        SQLITE = ErrorTranslation((sqlite3.Error,), translate)

        with SQLITE.translating("open /tmp/x.db"):
            ...

        class Db:
            @SQLITE.handles(lambda self, *args: f"query {self.path}")
            async def query(self) -> None: ...
    """

    def __init__(self, catch: tuple[type[BaseException], ...], translate: Translate) -> None:
        self.catch = catch
        self.translate = translate

    @contextlib.contextmanager
    def translating(self, what: str) -> Iterator[None]:
        try:
            yield
        except PaimonGroupError:
            raise
        except self.catch as err:
            raise self.translate(err, what) from err

    def handles(self, what: Callable[..., str]) -> Callable[[F], F]:
        """A decorator of a function or coroutine function; ``what`` names the
        operation, from the same arguments as the decorated call."""

        def decorate(fn: F) -> F:
            if inspect.iscoroutinefunction(fn):

                @functools.wraps(fn)
                async def run_async(*args: Any, **kwargs: Any) -> Any:
                    try:
                        return await fn(*args, **kwargs)
                    except PaimonGroupError:
                        raise
                    except self.catch as err:
                        raise self.translate(err, what(*args, **kwargs)) from err

                return cast(F, run_async)

            @functools.wraps(fn)
            def run(*args: Any, **kwargs: Any) -> Any:
                with self.translating(what(*args, **kwargs)):
                    return fn(*args, **kwargs)

            return cast(F, run)

        return decorate


CREDENTIALS_HOW: Final = (
    "--coordinator-username and --coordinator-password-file (or PAIMON_GROUP_COORDINATOR_USERNAME "
    "and PAIMON_GROUP_COORDINATOR_PASSWORD); in code ConnectOptions(username=..., password=...)"
)
"""How a user gives coordinator credentials, named in every error that asks for them:
the command line's flags and environment variables first, then the library's options."""
