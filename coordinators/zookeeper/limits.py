"""The size of a write as ZooKeeper counts it, refused before it is sent.

ZooKeeper reads a request only if its length (the frame after its 4-byte
length prefix: xid, type and body) is at most its ``jute.maxbuffer``,
1048575 bytes (1 MiB - 1) by default. A longer one is not answered: the
server closes the connection, and a client that sends it again (a retried
commit, a request queued behind it) closes it again, each time failing
every other request of the session in flight with it. So the coordinator
measures each ``multi`` before sending it, on both clients, and refuses one
that does not fit with :class:`RequestTooLarge`: one line, never retried.

The length is the one kazoo's codecs write (:func:`multi_size` is tested
against them): a ``MultiHeader`` per operation and one closing it, strings
and buffers with a 4-byte length, an ACL as its count and entries.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from kazoo.security import ACL

from coordinators.errors import ConfigError, RequestTooLarge
from coordinators.zookeeper.layout import TxnOp

JUTE_MAXBUFFER: Final = 1048575  # ZooKeeper's default jute.maxbuffer
SETTING: Final = "jute_maxbuffer"  # ConnectOptions.extra key: the servers' value
_HEADER: Final = 9  # MultiHeader: type, done, err
_XID_AND_TYPE: Final = 8


def max_request_of(extra: Mapping[str, str]) -> int:
    """The servers' ``jute.maxbuffer`` (``extra["jute_maxbuffer"]``, else the default)."""
    raw = extra.get(SETTING)
    if raw is None:
        return JUTE_MAXBUFFER
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = 0
    if value < 4096:
        raise ConfigError(
            f"ZooKeeper {SETTING}={raw!r}: give the servers' jute.maxbuffer in bytes "
            f"(at least 4096; ZooKeeper's default is {JUTE_MAXBUFFER})"
        )
    return value


def _string(text: str) -> int:
    return 4 + len(text.encode())


def acl_size(acl: Iterable[ACL]) -> int:
    return 4 + sum(4 + _string(a.id.scheme) + _string(a.id.id) for a in acl)


def multi_size(ops: Iterable[TxnOp], acl_bytes: int) -> int:
    """The length ZooKeeper checks of the ``multi`` of ``ops`` (``acl_bytes``:
    :func:`acl_size` of the ACL its creates carry)."""
    size = _XID_AND_TYPE + _HEADER
    for op in ops:
        size += _HEADER + _string(op.path) + 4  # path; version (or flags)
        if op.kind == "create":
            size += 4 + len(op.data) + acl_bytes
        elif op.kind == "set":
            size += 4 + len(op.data)
    return size


def refuse_if_too_large(ops: list[TxnOp], acl_bytes: int, limit: int, what: str) -> None:
    """Raise :class:`RequestTooLarge` if the ``multi`` of ``ops`` exceeds ``limit``."""
    size = multi_size(ops, acl_bytes)
    if size <= limit:
        return
    largest = max(ops, key=lambda op: len(op.data))
    raise RequestTooLarge(
        f"ZooKeeper refuses requests over its jute.maxbuffer: {what} would send "
        f"{size} bytes (the value of {largest.key!r}: {len(largest.data)} bytes), over the "
        f"limit of {limit} bytes; make the value smaller or split it over several keys "
        f"(or, if every server's jute.maxbuffer was raised, set {SETTING} in "
        "ConnectOptions.extra to it)"
    )
