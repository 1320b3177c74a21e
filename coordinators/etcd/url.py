"""etcd URLs: ``etcd[s]://HOST[:PORT][,HOST[:PORT]...][/PREFIX]``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from coordinators.errors import InvalidCoordinatorURL
from coordinators.urls import host_string, parse_hosts, redact_url, split_scheme

DEFAULT_PORT: Final = 2379

# -- URL ---------------------------------------------------------------------


@dataclass(frozen=True)
class EtcdTarget:
    """A parsed etcd URL: endpoints ``host:port``, key prefix, TLS or not."""

    endpoints: tuple[str, ...]
    prefix: str  # "" or "a/b/"
    tls: bool


def parse_etcd_url(url: str) -> EtcdTarget:
    """``etcd[s]://HOST[:PORT][,HOST[:PORT]...][/PREFIX]``; one-line error if bad."""
    shown = redact_url(url)
    scheme, rest = split_scheme(
        url, ("etcd", "etcds"), "an etcd URL",
        "etcd://HOST:PORT[,HOST:PORT...][/PREFIX] or etcds://...",
    )
    if "?" in rest or "#" in rest:
        raise InvalidCoordinatorURL(
            f"invalid etcd URL {shown!r}: query strings are not supported; pass options instead"
        )
    netloc, _, path = rest.partition("/")
    hosts = parse_hosts(netloc, DEFAULT_PORT, "etcd", shown)
    path = path.strip("/")
    prefix = ""
    if path:
        if not all(_SEGMENT.match(s) for s in path.split("/")):
            raise InvalidCoordinatorURL(
                f"invalid etcd URL {shown!r}: the key prefix may only use A-Z a-z 0-9 . _ - "
                "separated by '/'"
            )
        prefix = path + "/"
    return EtcdTarget(tuple(host_string(h) for h in hosts), prefix, scheme == "etcds")


_SEGMENT = re.compile(r"^[A-Za-z0-9._-]+$")
