"""The ZooKeeper backend (kazoo): ``zk://HOST:PORT[,HOST:PORT...][/CHROOT][?acl=...]``.

Modules: ``coordinator`` (:class:`ZooKeeperCoordinator`: the znode layout,
fencing, commits, sessions, watches, threads and security), which assembles
the others: ``url`` (parsing), ``security`` (ACLs, credentials, TLS,
redacted kazoo logs), ``errors`` (the one translation of kazoo errors, and
the retries), ``session`` and ``heartbeat`` (the session and what keeps it),
``layout`` and ``planning`` (the znodes of a key, and the ``multi`` of each
write), ``core`` and ``client`` (the shared state, kazoo's requests, the
client's start), ``guard`` (the ACLs of znodes that exist already), ``keys``
(get, list, create, delete, commit) and ``watch``; ``choice`` (kazoo or the
asyncio client), ``aio``, ``aio_txn`` and ``wire`` (the asyncio client:
kazoo's packets on an event-loop transport).
Nothing in the package imports this ``__init__``: it only re-exports the
backend's names.
"""

from coordinators.zookeeper.coordinator import ZooKeeperCoordinator
from coordinators.zookeeper.errors import translate
from coordinators.zookeeper.layout import EPOCH_PREFIX, FLAG_PREFIX, RESERVED_PREFIX
from coordinators.zookeeper.security import RedactCredentials, kazoo_log, parse_acl
from coordinators.zookeeper.session import ZooKeeperSession
from coordinators.zookeeper.url import DEFAULT_PORT, ZkTarget, parse_url

__all__ = [
    "DEFAULT_PORT",
    "EPOCH_PREFIX",
    "FLAG_PREFIX",
    "RESERVED_PREFIX",
    "RedactCredentials",
    "ZkTarget",
    "ZooKeeperCoordinator",
    "ZooKeeperSession",
    "kazoo_log",
    "parse_acl",
    "parse_url",
    "translate",
]
