"""Which tables a group reads: its ``--table`` values, plain names and patterns.

A value with ``*``, ``?`` or ``[`` is a shell-style pattern, matched with
:func:`fnmatch.fnmatchcase` against ``database.table`` (case as the catalog
spells it); any other value is a plain name. The subscription is the union of
its values. Every value, plain or pattern, is ``DATABASE.TABLE``: exactly one
dot, outside any ``[...]``, with something on each side and no white space. A
table's name has exactly one dot too, so a pattern's dot always meets the
name's: ``shop.*`` never matches a table of another database, and the
database part alone says which databases a listing must look into.

``*.*`` is allowed and means every table of every database.

A subscription of exactly one plain name is the single-table group
(:attr:`TableSubscription.is_single`).

Example::

    >>> sub = TableSubscription.parse(["shop.orders", "eu_*.events", "shop.orders"])
    >>> sub.plain_names, sub.patterns, sub.is_single
    (('shop.orders',), ('eu_*.events',), False)
    >>> sub.matches("eu_west.events"), sub.matches("eu_west.Events")
    (True, False)
    >>> sub.might_hold("eu_west"), sub.might_hold("us_east")
    (True, False)
    >>> TableSubscription.parse(["shop.orders"]).is_single
    True
    >>> TableSubscription.parse(["*.*"]).matches("any.table")
    True
    >>> TableSubscription.parse(["orders"])
    Traceback (most recent call last):
      ...
    coordinators.errors.ConfigError: bad --table 'orders': expected DATABASE.TABLE, e.g. shop.orders
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

from coordinators.errors import ConfigError

__all__ = ["TableSubscription", "is_pattern"]

_PATTERN_CHARS = frozenset("*?[")
_NAME_RE = re.compile(r"[^.\s]+\.[^.\s]+")


def is_pattern(value: str) -> bool:
    """Whether a ``--table`` value is a pattern (has ``*``, ``?`` or ``[``)."""
    return not _PATTERN_CHARS.isdisjoint(value)


def _unclosed_bracket(part: str) -> bool:
    """Whether ``part`` opens a ``[`` it does not close (read as
    :func:`fnmatch.translate` reads a set: ``!`` and a first ``]`` belong to
    it): the dot after it would be inside a ``[...]`` set."""
    i = 0
    while i < len(part):
        if part[i] == "[":
            j = i + 1
            if j < len(part) and part[j] == "!":
                j += 1
            if j < len(part) and part[j] == "]":
                j += 1
            j = part.find("]", j)
            if j < 0:
                return True
            i = j
        i += 1
    return False


def _problem(value: str) -> str | None:
    """Why ``value`` is not a ``--table`` value (None: it is one)."""
    if not value.strip():
        return "a table name is empty"
    if not _NAME_RE.fullmatch(value):
        if is_pattern(value):
            return "a pattern is DATABASE.TABLE too, e.g. shop.* (every table: *.*)"
        return "expected DATABASE.TABLE, e.g. shop.orders"
    database = value.split(".", 1)[0]
    if is_pattern(value) and _unclosed_bracket(database):
        return "a pattern's dot may not be inside [...]: write it DATABASE.TABLE, e.g. shop.*"
    return None


@dataclass(frozen=True)
class TableSubscription:
    """The tables a group reads. ``plain_names`` and ``patterns`` keep the
    order they were given in, each value once."""

    plain_names: tuple[str, ...]
    patterns: tuple[str, ...]

    @classmethod
    def parse(cls, values: Iterable[str]) -> TableSubscription:
        """The subscription of these ``--table`` values; a :class:`ConfigError`
        naming the first bad one (one line), or saying none was given."""
        plain: list[str] = []
        patterns: list[str] = []
        for value in values:
            problem = _problem(value)
            if problem is not None:
                raise ConfigError(f"bad --table {value!r}: {problem}")
            kept = patterns if is_pattern(value) else plain
            if value not in kept:
                kept.append(value)
        if not plain and not patterns:
            raise ConfigError("no --table given: name a table (DATABASE.TABLE) or a "
                              "pattern (e.g. 'shop.*'); --table may be repeated")
        return cls(tuple(plain), tuple(patterns))

    @property
    def is_single(self) -> bool:
        """Exactly one plain name and no pattern: the single-table group."""
        return len(self.plain_names) == 1 and not self.patterns

    def matches(self, name: str) -> bool:
        """Whether the table ``name`` (``database.table``) is subscribed."""
        return name in self.plain_names or any(fnmatchcase(name, p) for p in self.patterns)

    def might_hold(self, database: str) -> bool:
        """Whether a table of ``database`` could be subscribed (the databases a
        listing looks into)."""
        return any(n.split(".", 1)[0] == database for n in self.plain_names) or any(
            fnmatchcase(database, p.split(".", 1)[0]) for p in self.patterns)

    @property
    def named_databases(self) -> tuple[str, ...]:
        """The databases of the plain names, in order, each once."""
        return tuple(dict.fromkeys(n.split(".", 1)[0] for n in self.plain_names))

    def __str__(self) -> str:
        return ", ".join((*self.plain_names, *self.patterns))
