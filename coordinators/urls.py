"""Coordinator URLs: the parts every backend parses the same way.

A coordinator URL is ``SCHEME://REST``. The network backends share the shape
``SCHEME://HOST[:PORT][,HOST[:PORT]...][/PATH]``: hosts are names, IPv4
addresses or bracketed IPv6 addresses, each with an optional port (the
backend's default otherwise). Credentials never belong in a URL: they are
:class:`~coordinators.protocol.ConnectOptions` fields, and a URL that carries
``user:password@`` is refused without echoing it. Every message is one line
and shows the URL through :func:`redact_url`.

Example::

    >>> split_scheme("ZK://h:1/app", ("zk",), "a ZooKeeper URL", "zk://HOST:PORT")
    ('zk', 'h:1/app')
    >>> parse_hosts("a,[::1]:2182", 2181, "ZooKeeper", "zk://a,[::1]:2182")
    (('a', 2181), ('::1', 2182))
    >>> redact_url("etcd://root:pw@h:2379/app?password=x")
    'etcd://***@h:2379/app?password=***'
    >>> redact_url("zk://h:2181/app?acl=open")
    'zk://h:2181/app?acl=open'
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Final
from urllib.parse import urlsplit

from coordinators.acls import show_acl_spec
from coordinators.errors import CREDENTIALS_HOW, InvalidCoordinatorURL

HostPort = tuple[str, int]

_HOST = re.compile(r"^(?:\[([0-9A-Fa-f:.]+)\]|([A-Za-z0-9._-]+))(?::(\d{1,5}))?$")


def redact_url(url: str) -> str:
    """The URL with any ``user:password@`` part and query values masked
    (except :data:`SHOWN_QUERY_VALUES`: ``acl=open`` is no secret, and an
    ``acl`` list shows all but its digest hashes)."""
    if "://" not in url:
        # Not a URL at all (``etcd//oops``): show it as given, minus any
        # ``user:password@`` part and query values.
        text, _, query = url.partition("?")
        if "@" in text:
            text = "***@" + text.rsplit("@", 1)[1]
        return text + _masked_query(query)
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return f"{parts.scheme}://{netloc}{parts.path}" + _masked_query(parts.query)


# Query values that are never secret, shown as they are: ZooKeeper's ACL
# modes (an ``acl`` list is shown with its digest hashes masked:
# :func:`coordinators.acls.show_acl_spec`). Any other value (a token) is masked.
SHOWN_QUERY_VALUES: Final = {"acl": frozenset({"open", "creator"})}


def _masked_query(query: str) -> str:
    masked = "&".join(_masked_pair(kv) for kv in query.split("&") if kv)
    return f"?{masked}" if masked else ""


def _masked_pair(kv: str) -> str:
    if "=" not in kv:
        return kv
    name, value = kv.split("=", 1)
    if name.lower() == "acl":
        return f"{name}={show_acl_spec(value)}"  # only digest hashes are secret
    return kv if value in SHOWN_QUERY_VALUES.get(name.lower(), ()) else f"{name}=***"


def split_scheme(url: str, schemes: Collection[str], what: str, usage: str) -> tuple[str, str]:
    """``(scheme, rest)`` of ``SCHEME://REST``, the scheme in lower case and one
    of ``schemes``; otherwise a one-line error: not ``what``, use ``usage``."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in schemes:
        raise InvalidCoordinatorURL(f"not {what}: {redact_url(url)!r}; use {usage}")
    return scheme, rest


def refuse_credentials(netloc: str, backend: str, shown: str) -> None:
    """Refuse ``user:password@`` in the host part, without echoing it."""
    if "@" in netloc:
        raise InvalidCoordinatorURL(
            f"{backend} URL {shown!r} carries credentials: they do not belong in the URL; "
            f"give them with {CREDENTIALS_HOW}"
        )


def parse_host(part: str, default_port: int, backend: str, shown: str) -> HostPort:
    """One ``HOST[:PORT]`` (IPv6 in brackets); the host without brackets."""
    match = _HOST.match(part.strip())
    if match is None:
        raise InvalidCoordinatorURL(
            f"bad host {part!r} in {backend} URL {shown!r}: expected HOST[:PORT], "
            "IPv6 addresses in brackets"
        )
    host = match.group(1) or match.group(2)
    port_text = match.group(3)
    port = int(port_text) if port_text else default_port
    if not 0 < port < 65536:
        raise InvalidCoordinatorURL(f"invalid port in {part!r} in {backend} URL {shown!r}")
    return host, port


def parse_hosts(netloc: str, default_port: int, backend: str, shown: str) -> tuple[HostPort, ...]:
    """The comma-separated ``HOST[:PORT]`` list of a URL's host part."""
    refuse_credentials(netloc, backend, shown)
    if not netloc.strip():
        raise InvalidCoordinatorURL(f"{backend} URL {shown!r} names no host")
    return tuple(parse_host(p, default_port, backend, shown) for p in netloc.split(","))


def host_string(host: HostPort) -> str:
    """``host:port``, an IPv6 host in brackets."""
    name, port = host
    return f"[{name}]:{port}" if ":" in name else f"{name}:{port}"
