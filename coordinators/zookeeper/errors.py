"""Where kazoo errors become ours, and the retries of reads and conflicting writes."""

from __future__ import annotations

import ssl
from typing import Final

import tenacity
from kazoo.exceptions import (
    AuthFailedError,
    BadArgumentsError,
    ConnectionClosedError,
    ConnectionDropped,
    ConnectionLoss,
    InvalidACLError,
    KazooException,
    NoAuthError,
    NoChildrenForEphemeralsError,
    OperationTimeoutError,
    RequestTimeoutError,
    SASLException,
    SessionClosedRequireSaslError,
    SessionExpiredError,
    ZookeeperError,
    ZookeeperStoppedError,
)
from kazoo.handlers.threading import KazooTimeoutError

from coordinators import retry
from coordinators.errors import (
    AuthenticationFailed,
    ConfigError,
    CoordinatorError,
    CoordinatorUnavailable,
    ErrorTranslation,
    PaimonGroupError,
    SessionLost,
)

# Errors of a login that no retry will fix.
AUTH_ERRORS: Final = (AuthFailedError, SASLException, SessionClosedRequireSaslError)


class Conflict(CoordinatorUnavailable):
    """The state a write relied on changed before it was applied; re-plan it."""


# Reads are idempotent: one that lost its connection mid-flight is sent again.
READ_RETRY: Final = retry.READS.copy(retry=tenacity.retry_if_exception_type(ConnectionLoss))
# Writes whose implicit guards failed re-read and try again.
CONFLICT_RETRY: Final = retry.CONFLICTS.copy(retry=tenacity.retry_if_exception_type(Conflict))

# -------------------------------------------------------------------- errors


def translate(err: BaseException, what: str) -> PaimonGroupError:
    """The one place where kazoo (and socket) errors become ours (raise it ``from err``)."""
    if isinstance(err, PaimonGroupError):
        return err
    name = type(err).__name__
    if isinstance(err, ConnectionClosedError):
        return CoordinatorError(f"ZooKeeper coordinator is closed ({what})")
    if isinstance(err, SessionClosedRequireSaslError):
        return AuthenticationFailed(
            f"ZooKeeper requires authentication ({what}): configure ConnectOptions "
            "username, password and auth_scheme"
        )
    if isinstance(err, AuthFailedError | SASLException):
        return AuthenticationFailed(
            f"ZooKeeper refused our credentials ({what}): check the username, the password "
            "and the auth scheme"
        )
    if isinstance(err, NoAuthError):
        return AuthenticationFailed(
            f"ZooKeeper denied access ({what}): the znode ACL does not grant the configured "
            "identity (wrong credentials, or znodes created by another identity)"
        )
    if isinstance(err, InvalidACLError):
        return ConfigError(f"ZooKeeper rejected our ACL ({what}): check the acl setting")
    if isinstance(err, NoChildrenForEphemeralsError):
        return ConfigError(f"a key cannot be created under an ephemeral key ({what})")
    if isinstance(err, BadArgumentsError):
        return ConfigError(f"ZooKeeper rejected the request ({what}): invalid characters in a key?")
    if isinstance(err, SessionExpiredError):
        return SessionLost(f"ZooKeeper session expired ({what}): open a new coordinator")
    if isinstance(
        err,
        ConnectionLoss
        | ConnectionDropped
        | OperationTimeoutError
        | RequestTimeoutError
        | ZookeeperStoppedError
        | KazooTimeoutError,
    ):
        return CoordinatorUnavailable(f"ZooKeeper connection problem ({what}): {name}; retry")
    if isinstance(err, ssl.SSLError):
        return AuthenticationFailed(f"TLS with ZooKeeper failed ({what}): {err.reason or name}")
    if isinstance(err, OSError):
        return CoordinatorUnavailable(f"cannot reach ZooKeeper ({what}): {err.strerror or name}")
    if isinstance(err, ZookeeperError):
        return CoordinatorError(f"ZooKeeper refused the request ({what}): {name}")
    return CoordinatorError(f"ZooKeeper client error ({what}): {name}")


# The one translation of kazoo (and socket) errors: ``with translated(what):``.
_KAZOO: Final = ErrorTranslation((KazooException, OSError), translate)
translated: Final = _KAZOO.translating
