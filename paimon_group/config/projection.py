"""The columns a member reads (``--columns`` / ``MemberConfig.columns``).

A projection is pushed down to the reader: columns not listed are never
decoded (``paimon_group.arrowread`` reads only the listed ones, plus what a
merge needs: the primary key, ``sequence.field``, the sequence number and the
row kind, which are dropped again before delivery). Bad input (an empty
name, a duplicate, a column the table does not have) is one clear
:class:`ConfigError` before anything is joined or created.

Example::

    parse_columns("id, payload")                 # ('id', 'payload')
    check_columns(["id", "v", "payload"], ("id", "nope"))   # ConfigError
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from paimon_group.errors import ConfigError

__all__ = ["check_columns", "parse_columns"]


def parse_columns(text: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """``"a,b"`` or ``["a", "b"]`` as a tuple of names; None for no projection."""
    if text is None:
        return None
    parts = text.split(",") if isinstance(text, str) else list(text)
    names = tuple(str(p).strip() for p in parts)
    if not names or any(not n for n in names):
        raise ConfigError(f"--columns needs comma-separated column names, got {text!r}")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"--columns names {duplicates} more than once")
    return names


def check_columns(field_names: Iterable[str], columns: Sequence[str] | None) -> None:
    """Raise :class:`ConfigError` unless every name in ``columns`` is a field."""
    if columns is None:
        return
    fields = list(field_names)
    missing = [c for c in columns if c not in fields]
    if missing:
        raise ConfigError(
            f"--columns {missing} are not columns of the table (it has {fields})"
        )
