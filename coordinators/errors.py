"""The one error hierarchy of paimon-group.

Every error we raise derives from :class:`PaimonGroupError`. Its ``retriable``
flag tells callers (and the tenacity policies in :mod:`coordinators.retry`)
whether trying the same operation again may succeed. Backend exceptions are
translated in one place per backend, always with ``raise ... from err``, so a
``kazoo`` or ``grpc`` exception never escapes a coordinator.

Messages are one line, say what to do, and never contain a credential.
"""

from __future__ import annotations


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


class CorruptValue(CoordinatorError):
    """A value stored in the coordinator cannot be decoded."""
