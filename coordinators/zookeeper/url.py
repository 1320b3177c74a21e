"""ZooKeeper URLs: ``zk://HOST[:PORT][,HOST[:PORT]...][/CHROOT][?acl=...][&client=...]``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qsl, unquote, urlsplit

from coordinators.acls import show_acl_spec
from coordinators.errors import InvalidCoordinatorURL
from coordinators.urls import host_string, parse_hosts, redact_url, split_scheme

DEFAULT_PORT: Final = 2181
# The ZooKeeper clients the coordinator can run on (docs/zookeeper.md).
CLIENTS: Final = ("kazoo", "asyncio")

# ------------------------------------------------------------------------- URL


@dataclass(frozen=True, slots=True)
class ZkTarget:
    """A parsed ``zk://`` URL.

    Example::

        target = parse_url("zk://zk1:2181,zk2/paimon?acl=open")
        assert target.hosts == (("zk1", 2181), ("zk2", 2181))
        assert (target.chroot, target.acl) == ("/paimon", "open")
    """

    hosts: tuple[tuple[str, int], ...]
    chroot: str  # "" or "/a/b"
    acl: str | None = None
    # ``?client=``: kazoo or asyncio; None: the default (PAIMON_GROUP_ZK_CLIENT, else asyncio).
    client: str | None = None

    def hosts_string(self) -> str:
        return ",".join(host_string(h) for h in self.hosts)

    def display(self) -> str:
        """The URL without anything secret."""
        url = f"zk://{self.hosts_string()}{self.chroot}"
        if self.acl is not None:
            url += f"?acl={show_acl_spec(self.acl)}"  # digest hashes masked
        if self.client is not None:
            url += f"{'&' if self.acl is not None else '?'}client={self.client}"
        return url


def parse_url(url: str) -> ZkTarget:
    """The hosts, chroot and ACL of a ``zk://`` URL (one-line errors)."""
    shown = redact_url(url)
    _, rest = split_scheme(
        url, ("zk",), "a ZooKeeper URL", "zk://HOST:PORT[,HOST:PORT...][/CHROOT]"
    )
    try:
        parts = urlsplit("zk://" + rest)
    except ValueError as err:
        raise InvalidCoordinatorURL(f"malformed ZooKeeper URL {shown!r}") from err
    hosts = parse_hosts(parts.netloc, DEFAULT_PORT, "ZooKeeper", shown)
    chroot = unquote(parts.path).rstrip("/") if parts.path not in ("", "/") else ""
    if chroot:
        segments = chroot.split("/")[1:]
        if any(s in ("", ".", "..") for s in segments) or parts.path.endswith("//"):
            raise InvalidCoordinatorURL(f"invalid chroot {chroot!r} in ZooKeeper URL {shown!r}")
        if segments[0] == "zookeeper":
            raise InvalidCoordinatorURL(
                f"chroot {chroot!r} is inside ZooKeeper's own /zookeeper tree: choose another"
            )
    if parts.fragment:
        raise InvalidCoordinatorURL(f"ZooKeeper URL {shown!r} takes no fragment")
    if any(p and "=" not in p for p in parts.query.split("&")):  # maybe a bare secret
        raise InvalidCoordinatorURL(
            f"a parameter without '=' in ZooKeeper URL {shown!r}: only acl=... and client=... "
            "are accepted")
    acl: str | None = None
    client: str | None = None
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name == "client":
            if value not in CLIENTS:
                raise InvalidCoordinatorURL(
                    f"unknown client {value!r} in ZooKeeper URL {shown!r}: kazoo or asyncio"
                )
            client = value
            continue
        if name != "acl":
            raise InvalidCoordinatorURL(
                f"unknown parameter {name!r} in ZooKeeper URL {shown!r}: only acl and client "
                "are accepted"
            )
        acl = value
    return ZkTarget(hosts, chroot, acl, client)
