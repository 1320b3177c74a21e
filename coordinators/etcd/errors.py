"""What a failed etcd call means: retry it or not, and the one translation
of gRPC and etcd failures into our errors."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Final

import grpc  # type: ignore[import-untyped]
import grpc.aio  # type: ignore[import-untyped]
import tenacity

from coordinators import retry
from coordinators.errors import (
    AuthenticationFailed,
    CoordinatorError,
    CoordinatorUnavailable,
    SessionLost,
)

# -- errors ------------------------------------------------------------------


class Failure(enum.Enum):
    """What a failed call means for retrying it (see :func:`classify`)."""

    NOT_APPLIED = "not applied"  # certainly not executed: retry anything
    AMBIGUOUS = "ambiguous"  # may have been executed: retry idempotent calls only
    TOKEN = "token"  # auth token expired or stale: refresh, then retry anything
    TLS = "tls"  # TLS handshake refused either way
    AUTH = "auth"  # credentials refused or missing, or permission denied
    LEASE_GONE = "lease gone"  # the session's lease no longer exists
    COMPACTED = "compacted"  # the requested revision was compacted
    FATAL = "fatal"  # a request the server will never accept


_TLS_HINTS = ("tsi_", "handshake", "ssl", "certificate", "tls", "verification")
_AUTH_HINTS = ("authentication", "user name", "permission denied", "not authorized")
_NOT_SENT_HINTS = (
    "failed to connect",
    "connection refused",
    "etcdserver: no leader",
    "etcdserver: too many requests",
    "not primary",
    "dns resolution failed",
)


def _rpc_code_and_details(err: BaseException) -> tuple[Any, str] | None:
    if isinstance(err, grpc.RpcError) and callable(getattr(err, "code", None)):
        return err.code(), str(err.details() or "")
    return None


def classify(err: BaseException) -> Failure:
    """How to react to ``err`` raised by a gRPC call to etcd."""
    rpc_error = _rpc_code_and_details(err)
    if rpc_error is None:
        if isinstance(err, TimeoutError | OSError):
            return Failure.AMBIGUOUS
        return Failure.FATAL
    code, details = rpc_error
    text = details.lower()
    status = grpc.StatusCode
    if "invalid auth token" in text or "auth store is old" in text:
        return Failure.TOKEN
    if code is status.UNAVAILABLE and any(h in text for h in _TLS_HINTS):
        return Failure.TLS
    if code in (status.UNAUTHENTICATED, status.PERMISSION_DENIED) or (
        code in (status.INVALID_ARGUMENT, status.FAILED_PRECONDITION)
        and any(h in text for h in _AUTH_HINTS)
    ):
        return Failure.AUTH
    if code is status.NOT_FOUND and "lease" in text:
        return Failure.LEASE_GONE
    if code is status.OUT_OF_RANGE and "compacted" in text:
        return Failure.COMPACTED
    if code in (status.UNAVAILABLE, status.RESOURCE_EXHAUSTED) and any(
        h in text for h in _NOT_SENT_HINTS
    ):
        return Failure.NOT_APPLIED
    if code in (status.UNAVAILABLE, status.DEADLINE_EXCEEDED, status.CANCELLED, status.UNKNOWN):
        return Failure.AMBIGUOUS
    return Failure.FATAL


def describe(err: BaseException) -> str:
    """``CODE: details`` of a gRPC error (or the exception), on one line."""
    rpc_error = _rpc_code_and_details(err)
    if rpc_error is None:
        return _one_line(f"{type(err).__name__}: {err}")
    code, details = rpc_error
    return _one_line(f"{getattr(code, 'name', code)}: {details}")


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def translate_error(
    err: BaseException,
    what: str,
    endpoints: Sequence[str],
    *,
    username: str | None = None,
    idempotent: bool = True,
) -> CoordinatorError:
    """The one place where gRPC / etcd failures become our errors.

    The message is one line: what we did, where, and what to check. It never
    contains a credential (the password and the token are never in scope).
    """
    if isinstance(err, CoordinatorError):
        return err
    where = ",".join(endpoints)
    rpc_error = _rpc_code_and_details(err)
    detail = _one_line(rpc_error[1] if rpc_error else f"{type(err).__name__}: {err}")
    kind = classify(err)
    if kind is Failure.TLS:
        return AuthenticationFailed(
            f"TLS handshake with etcd at {where} failed during {what}: check the CA, the "
            f"client certificate and key, and the server name ({detail})"
        )
    if kind is Failure.AUTH:
        who = f"user {username!r}" if username else "no credentials"
        return AuthenticationFailed(
            f"etcd at {where} refused {what} with {who}: check the username, password and "
            f"role permissions ({detail})"
        )
    if kind is Failure.LEASE_GONE:
        return SessionLost(
            f"etcd session lease expired or was revoked ({what}); open a new coordinator "
            f"and re-register"
        )
    if kind in (Failure.NOT_APPLIED, Failure.AMBIGUOUS, Failure.TOKEN):
        outcome = (
            "" if idempotent or kind is not Failure.AMBIGUOUS
            else "; the write may or may not have been applied, re-read before retrying"
        )
        return CoordinatorUnavailable(
            f"etcd at {where} unavailable during {what}{outcome} ({detail})"
        )
    if kind is Failure.COMPACTED:
        return CoordinatorError(f"etcd revision compacted during {what} ({detail})")
    if "too many operations in txn request" in detail:
        return CoordinatorError(
            f"etcd at {where} rejected {what}: more operations than its --max-txn-ops "
            f"(128 by default) allows in one transaction; start etcd with a larger "
            f"--max-txn-ops (docs/etcd.md, groups of many shards)"
        )
    return CoordinatorError(f"etcd at {where} rejected {what} ({detail})")


# -- retries -----------------------------------------------------------------

# Built once; every call takes a copy with its own stop, retry predicate and sleep.
RETRY_POLICY: Final = retry.RPCS


def _retry_predicate(idempotent: bool) -> tenacity.retry_base:
    def should_retry(err: BaseException) -> bool:
        kind = classify(err)
        return kind in (Failure.NOT_APPLIED, Failure.TOKEN) or (
            idempotent and kind is Failure.AMBIGUOUS
        )

    return tenacity.retry_if_exception(should_retry)


RETRY_IDEMPOTENT: Final = _retry_predicate(True)
RETRY_WRITE: Final = _retry_predicate(False)
