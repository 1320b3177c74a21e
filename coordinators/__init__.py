"""Coordinator backends behind one small protocol (see :mod:`coordinators.protocol`)."""

from coordinators.errors import (
    AuthenticationFailed,
    ConfigError,
    CoordinatorError,
    CoordinatorUnavailable,
    CorruptValue,
    InvalidCoordinatorURL,
    PaimonGroupError,
    SessionLost,
    SessionSuspended,
)
from coordinators.protocol import (
    Check,
    ConnectOptions,
    Coordinator,
    Delete,
    Entry,
    Op,
    Put,
    Secret,
    Session,
    SessionState,
    Watch,
)
from coordinators.registry import BACKENDS, open_coordinator, redact_url

__all__ = [
    "BACKENDS",
    "AuthenticationFailed",
    "Check",
    "ConfigError",
    "ConnectOptions",
    "Coordinator",
    "CoordinatorError",
    "CoordinatorUnavailable",
    "CorruptValue",
    "Delete",
    "Entry",
    "InvalidCoordinatorURL",
    "Op",
    "PaimonGroupError",
    "Put",
    "Secret",
    "Session",
    "SessionLost",
    "SessionState",
    "SessionSuspended",
    "Watch",
    "open_coordinator",
    "redact_url",
]
