"""Backends chosen by URL scheme, from one registry.

==========  ==========================================  =======================
scheme      URL                                         backend
==========  ==========================================  =======================
sqlite      ``sqlite:///ABSOLUTE/PATH.db``              embedded, one host
memory      ``memory://NAME``                           embedded, one process
etcd        ``etcd://HOST:PORT[,HOST:PORT...][/PREFIX]`` etcd v3 (aetcd)
etcds       same, TLS required                          etcd v3 over TLS
zk          ``zk://HOST:PORT[,HOST:PORT...][/CHROOT]``  ZooKeeper (kazoo)
==========  ==========================================  =======================

The registry is the top of :mod:`coordinators`: it imports the backends, and
nothing below it imports the registry. Backends are imported lazily, when a
URL of theirs is opened, so using the embedded one never imports grpc or
kazoo.

Example::

    from coordinators import open_coordinator
    coord = open_coordinator("memory://docs")   # not yet connected
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from coordinators.errors import InvalidCoordinatorURL
from coordinators.protocol import ConnectOptions, Coordinator
from coordinators.urls import redact_url

__all__ = ["BACKENDS", "network_hosts", "open_coordinator", "redact_url", "scheme_of"]

BACKENDS: dict[str, str] = {
    "sqlite": "coordinators.sqlite:SqliteCoordinator",
    "memory": "coordinators.sqlite:SqliteCoordinator",
    "etcd": "coordinators.etcd:EtcdCoordinator",
    "etcds": "coordinators.etcd:EtcdCoordinator",
    "zk": "coordinators.zookeeper:ZooKeeperCoordinator",
}


def _embedded() -> type[Coordinator]:
    from coordinators.sqlite import SqliteCoordinator

    return SqliteCoordinator


def _etcd() -> type[Coordinator]:
    from coordinators.etcd import EtcdCoordinator

    return EtcdCoordinator


def _zookeeper() -> type[Coordinator]:
    from coordinators.zookeeper import ZooKeeperCoordinator

    return ZooKeeperCoordinator


# The class of each scheme, imported on first use (the same table as BACKENDS).
_CLASSES: Final[dict[str, Callable[[], type[Coordinator]]]] = {
    "sqlite": _embedded,
    "memory": _embedded,
    "etcd": _etcd,
    "etcds": _etcd,
    "zk": _zookeeper,
}


def scheme_of(url: str) -> str:
    if "://" not in url:
        raise InvalidCoordinatorURL(
            f"malformed coordinator URL {redact_url(url)!r}: expected SCHEME://..., "
            f"one of {', '.join(sorted(BACKENDS))}"
        )
    scheme = url.split("://", 1)[0].lower()
    if scheme not in BACKENDS:
        raise InvalidCoordinatorURL(
            f"unknown coordinator scheme {scheme!r} in {redact_url(url)!r}: "
            f"use one of {', '.join(sorted(BACKENDS))}"
        )
    return scheme


def open_coordinator(url: str, options: ConnectOptions | None = None) -> Coordinator:
    """A coordinator for ``url``, not yet connected (``await c.connect()``)."""
    cls: Callable[[str, ConnectOptions], Coordinator] = _CLASSES[scheme_of(url)]()
    return cls(url, options or ConnectOptions())


def network_hosts(url: str) -> tuple[tuple[str, int], ...]:
    """The ``(host, port)`` servers of an etcd or ZooKeeper URL, validated as
    the backend validates it (one-line errors); ``()`` for an embedded one."""
    scheme = scheme_of(url)
    if scheme in ("etcd", "etcds"):
        from coordinators.etcd.url import parse_etcd_url

        return tuple(_host_port(e) for e in parse_etcd_url(url).endpoints)
    if scheme == "zk":
        from coordinators.zookeeper.url import parse_url

        return parse_url(url).hosts
    return ()


def _host_port(endpoint: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` back into a pair."""
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)
