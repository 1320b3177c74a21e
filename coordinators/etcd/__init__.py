"""The etcd v3 backend: ``etcd://HOST:PORT[,HOST:PORT...][/PREFIX]`` (``etcds://`` = TLS).

Modules: ``coordinator`` (:class:`EtcdCoordinator`, and how the protocol maps
onto etcd), which assembles the others: ``url``, ``errors`` (what a failure
means: retry or not, and the one translation), ``channel`` (channels,
failover, the auth token), ``session`` (the lease and its keep-alive thread)
and ``watch``. Nothing in the package imports this ``__init__``: it only
re-exports the backend's names.
"""

from coordinators.etcd.coordinator import EtcdCoordinator
from coordinators.etcd.errors import Failure, classify, translate_error
from coordinators.etcd.session import EtcdSession
from coordinators.etcd.url import DEFAULT_PORT, EtcdTarget, parse_etcd_url
from coordinators.etcd.watch import EtcdWatch

__all__ = [
    "DEFAULT_PORT",
    "EtcdCoordinator",
    "EtcdSession",
    "EtcdTarget",
    "EtcdWatch",
    "Failure",
    "classify",
    "parse_etcd_url",
    "translate_error",
]
