"""Where SQLite errors become ours: the one translation of the embedded backend."""

from __future__ import annotations

import sqlite3
from typing import Final

from coordinators.errors import (
    CoordinatorError,
    CoordinatorUnavailable,
    ErrorTranslation,
)

# SQLite primary result codes (the low byte of an extended code).
_SQLITE_BUSY: Final = 5
_SQLITE_LOCKED: Final = 6
_SQLITE_CORRUPT: Final = 11
_SQLITE_CANTOPEN: Final = 14
_SQLITE_NOTADB: Final = 26

# ---------------------------------------------------------------- error translation


def translate(err: BaseException, where: str) -> CoordinatorError:
    """The one place where SQLite errors become ours (raise it ``from err``)."""
    code = getattr(err, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    reason = str(err) or type(err).__name__
    if primary in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return CoordinatorUnavailable(
            f"SQLite coordinator {where} is locked by another connection ({reason}); retry"
        )
    if primary == _SQLITE_CANTOPEN:
        return CoordinatorUnavailable(
            f"cannot open SQLite coordinator {where} ({reason}): check the path and "
            "its permissions",
            retriable=False,
        )
    if primary in (_SQLITE_NOTADB, _SQLITE_CORRUPT):
        return CoordinatorError(
            f"SQLite coordinator {where} is corrupt or not a SQLite database ({reason}): "
            "restore it or point the URL at a new file"
        )
    if isinstance(err, sqlite3.OperationalError):
        return CoordinatorUnavailable(f"SQLite coordinator {where} failed: {reason}")
    return CoordinatorError(f"SQLite coordinator {where} failed: {reason}")


# The one translation of SQLite errors, around every call into sqlite3.
SQLITE_ERRORS: Final = ErrorTranslation((sqlite3.Error,), translate)
