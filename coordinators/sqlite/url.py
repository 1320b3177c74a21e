"""The embedded coordinator's URLs: ``sqlite:///ABSOLUTE/PATH.db`` and ``memory://NAME``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote, urlsplit

from coordinators.errors import InvalidCoordinatorURL
from coordinators.urls import redact_url, split_scheme

_MEMORY_NAME = re.compile(r"[A-Za-z0-9._-]+")

# --------------------------------------------------------------------------- URLs


@dataclass(frozen=True, slots=True)
class _Target:
    kind: Literal["file", "memory"]
    # The absolute file path, or the in-memory database's name.
    location: str

    def describe(self) -> str:
        return self.location if self.kind == "file" else f"memory://{self.location}"


def parse_url(url: str) -> _Target:
    """The database a ``sqlite://`` or ``memory://`` URL names (one-line errors)."""
    shown = redact_url(url)
    scheme, rest = split_scheme(
        url, ("sqlite", "memory"), "an embedded coordinator URL",
        "sqlite:///ABSOLUTE/PATH.db or memory://NAME",
    )
    if scheme == "memory":
        if not _MEMORY_NAME.fullmatch(rest):
            raise InvalidCoordinatorURL(
                f"invalid in-memory coordinator URL {shown!r}: use memory://NAME, "
                "NAME made of letters, digits, '.', '_' and '-'"
            )
        return _Target("memory", rest)
    try:
        parts = urlsplit(url)
    except ValueError as err:
        raise InvalidCoordinatorURL(f"malformed SQLite coordinator URL {shown!r}") from err
    if parts.query or parts.fragment:
        raise InvalidCoordinatorURL(f"SQLite coordinator URL {shown!r} takes no query or fragment")
    path = unquote(parts.path)
    if parts.netloc or not path.startswith("/"):
        raise InvalidCoordinatorURL(
            f"the SQLite coordinator path in {shown!r} must be absolute: "
            "use sqlite:///ABSOLUTE/PATH.db (three slashes)"
        )
    if path.endswith("/") or "\x00" in path:
        raise InvalidCoordinatorURL(
            f"SQLite coordinator URL {shown!r} must name a file: sqlite:///ABSOLUTE/PATH.db"
        )
    return _Target("file", path)
