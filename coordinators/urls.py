"""Coordinator URLs: the parts every backend parses the same way.

A coordinator URL is ``SCHEME://REST``. The network backends share the shape
``SCHEME://HOST[:PORT][,HOST[:PORT]...][/PATH]``: hosts are names, IPv4
addresses or bracketed IPv6 addresses, each with an optional port (the
backend's default otherwise). Credentials never belong in a URL: they are
:class:`~coordinators.protocol.ConnectOptions` fields, and a URL that carries
``user:password@`` is refused without echoing it, whatever the password holds
(``/ ? # @ :``: :func:`userinfo_end` finds where it ends). Every message is
one line and shows the URL through :func:`redact_url`.

Example::

    >>> split_scheme("ZK://h:1/app", ("zk",), "a ZooKeeper URL", "zk://HOST:PORT")
    ('zk', 'h:1/app')
    >>> parse_hosts("a,[::1]:2182", 2181, "ZooKeeper", "zk://a,[::1]:2182")
    (('a', 2181), ('::1', 2182))
    >>> redact_url("etcd://root:pw@h:2379/app?password=x")
    'etcd://***@h:2379/app?password=***'
    >>> redact_url("zk://h:2181/app?acl=open")
    'zk://h:2181/app?acl=open'
    >>> redact_url("etcd://root:SE/KR?E#T@h:2379/app")
    'etcd://***@h:2379/app'
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Final

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
        return _masked_text(url)
    # The user information is found by userinfo_end, whatever the secret
    # holds (``/ ? # @ :``); the values of ``;`` parameters (a Spark Connect
    # token) are masked as query values are, and a fragment as ``#***``.
    scheme, _, rest = url.partition("://")
    if not _SCHEME.fullmatch(scheme):
        return _masked_text(url)
    end = userinfo_end(rest)
    shown = "***@" + _masked_tail(rest[end + 1:]) if end >= 0 else _masked_tail(rest)
    return f"{scheme.lower()}://{shown}"


# Query values that are never secret, shown as they are: ZooKeeper's ACL
# modes (an ``acl`` list is shown with its digest hashes masked:
# :func:`coordinators.acls.show_acl_spec`). Any other value (a token) is masked.
SHOWN_QUERY_VALUES: Final = {"acl": frozenset({"open", "creator"})}


def _masked_query(query: str) -> str:
    masked = "&".join(_masked_pair(kv) for kv in query.split("&") if kv)
    return f"?{masked}" if masked else ""


def _masked_pair(kv: str) -> str:
    if "=" not in kv:
        return MASK  # a parameter without "=" may be a bare secret
    name, value = kv.split("=", 1)
    if name.lower() == "acl":
        return f"{name}={show_acl_spec(value)}"  # only digest hashes are secret
    return kv if value in SHOWN_QUERY_VALUES.get(name.lower(), ()) else f"{name}=***"


MASK: Final = "***"

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")

# Where a URL's host part ends (when nothing before it is a secret).
_PART_END = re.compile(r"[/?#]")


def userinfo_end(rest: str) -> int:
    """Where the ``user:password@`` part of a URL ends: the index of its ``@``
    in ``rest`` (the URL after ``SCHEME://``), or -1 when it has none.

    A secret may hold any character (``/ ? # @ :`` included), so the host part
    does not end at the first ``/``. The text up to the first ``/``, ``?`` or
    ``#`` is a host list unless it holds an ``@`` or cannot be one (no host
    has ``root:SE`` for a port); a ``HOST:PORT`` followed later by
    ``@HOST`` is taken for a password of digits (``root:12/34@h``). Then the
    user information runs to the last ``@`` followed by what can be a host
    (or to the last ``@`` at all). An ``@`` after a bucket or host without a
    port (``s3://bucket/a@b``) is part of the path, and so is any ``@`` of a
    URL without a host part (``sqlite:///tmp/a@b.db``).
    """
    if "@" not in rest or rest.startswith("/"):
        return -1
    first = _PART_END.split(rest, 1)[0]
    ats = [i for i, c in enumerate(rest) if c == "@"]
    hosted = [i for i in ats if _could_be_hosts(_PART_END.split(rest[i + 1:], 1)[0])]
    if "@" not in first and _could_be_hosts(first) and (":" not in first or not hosted):
        return -1
    return (hosted or ats)[-1]


def has_userinfo(url: str) -> bool:
    """True if ``url`` (``SCHEME://...``) carries a ``user:password@`` part."""
    scheme, sep, rest = url.partition("://")
    return bool(sep) and bool(_SCHEME.fullmatch(scheme)) and userinfo_end(rest) >= 0


def _could_be_hosts(text: str) -> bool:
    """True if ``text`` can be a URL's host list (``HOST[:PORT][,...]``)."""
    return bool(text) and all(_HOST.match(part) for part in text.split(","))


def _masked_tail(text: str) -> str:
    """``HOST/PATH;PARAMS?QUERY#FRAGMENT`` with the parameters' values and the
    fragment masked."""
    text, hash_sign, _ = text.partition("#")
    path, question, query = text.partition("?")
    path, *params = path.split(";")
    shown = path + "".join(f";{_masked_pair(p)}" for p in params if p)
    if question:
        shown += _masked_query(query)
    return shown + ("#***" if hash_sign else "")


def _masked_text(text: str) -> str:
    """What is not a URL, shown minus anything up to its last ``@`` and its
    parameters' values."""
    if "@" not in text:
        return _masked_tail(text)
    return "***@" + _masked_tail(text.rsplit("@", 1)[1])


def split_scheme(url: str, schemes: Collection[str], what: str, usage: str) -> tuple[str, str]:
    """``(scheme, rest)`` of ``SCHEME://REST``, the scheme in lower case and one
    of ``schemes``; otherwise a one-line error: not ``what``, use ``usage``.
    A URL carrying ``user:password@`` is refused first (:func:`refuse_credentials`)."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in schemes:
        raise InvalidCoordinatorURL(f"not {what}: {redact_url(url)!r}; use {usage}")
    refuse_credentials(url, what.split(" ", 1)[-1])
    return scheme, rest


def refuse_credentials(url: str, what: str = "coordinator URL") -> None:
    """Refuse a ``user:password@`` part (:func:`has_userinfo`), in one line that
    shows the URL redacted; ``what`` names the URL (``"etcd URL"``)."""
    if has_userinfo(url):
        raise InvalidCoordinatorURL(
            f"{what} {redact_url(url)!r} carries credentials: they do not belong in the URL; "
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
    """The comma-separated ``HOST[:PORT]`` list of a URL's host part (an ``@``
    in it is refused without echoing it)."""
    if "@" in netloc:
        raise InvalidCoordinatorURL(
            f"{backend} URL {shown!r} carries credentials: they do not belong in the URL; "
            f"give them with {CREDENTIALS_HOW}"
        )
    if not netloc.strip():
        raise InvalidCoordinatorURL(f"{backend} URL {shown!r} names no host")
    return tuple(parse_host(p, default_port, backend, shown) for p in netloc.split(","))


def host_string(host: HostPort) -> str:
    """``host:port``, an IPv6 host in brackets."""
    name, port = host
    return f"[{name}]:{port}" if ":" in name else f"{name}:{port}"
