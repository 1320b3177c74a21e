"""Security of the ZooKeeper backend: ACLs, credentials (digest, SASL), TLS,
and credentials kept out of kazoo's logs."""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, Literal

from kazoo.protocol.serialization import SASL, Auth, Connect
from kazoo.security import ACL, CREATOR_ALL_ACL, Id, Permissions, make_digest_acl_credential

from coordinators.errors import CREDENTIALS_HOW, ConfigError
from coordinators.protocol import ConnectOptions

# kazoo logs through this logger (see RedactCredentials).
kazoo_log = logging.getLogger("coordinators.zookeeper.kazoo")

_PERMS: Final = {
    "c": Permissions.CREATE,
    "r": Permissions.READ,
    "w": Permissions.WRITE,
    "d": Permissions.DELETE,
    "a": Permissions.ADMIN,
}

# ------------------------------------------------------------------------- ACL


def parse_acl(spec: str) -> tuple[ACL, ...]:
    """The ACL list of an ``acl`` setting (see the module docstring)."""
    entries = [e.strip() for e in spec.split(",") if e.strip()]
    if not entries:
        raise ConfigError("empty ZooKeeper acl: use creator, open, or SCHEME:ID:PERMS entries")
    acl: list[ACL] = []
    for entry in entries:
        if entry == "creator":
            acl.extend(CREATOR_ALL_ACL)
        elif entry == "open":
            acl.append(ACL(Permissions.ALL, Id("world", "anyone")))
        else:
            scheme, _, rest = entry.partition(":")
            ident, _, perms = rest.rpartition(":")
            if not scheme or not ident or not perms or any(p not in _PERMS for p in perms):
                raise ConfigError(
                    f"invalid ZooKeeper acl entry {entry.split(':', 1)[0]}:...: use creator, "
                    "open, or SCHEME:ID:PERMS with PERMS made of c, r, w, d, a"
                )
            mask = 0
            for p in perms:
                mask |= _PERMS[p]
            acl.append(ACL(mask, Id(scheme, ident)))
    return tuple(acl)


# -------------------------------------------------------------- credentials


@dataclass(frozen=True)
class Credentials:
    """What kazoo needs to authenticate. Never printed."""

    scheme: Literal["digest", "sasl"]
    auth_data: list[tuple[str, str]] = field(repr=False)
    sasl_options: dict[str, str] | None = field(repr=False)
    secrets: tuple[str, ...] = field(repr=False)

    def __repr__(self) -> str:
        return f"Credentials(scheme={self.scheme!r})"

    @property
    def mechanism(self) -> str:
        if self.sasl_options is None:
            return self.scheme
        return f"SASL {self.sasl_options.get('mechanism', 'DIGEST-MD5')}"

    @property
    def plaintext(self) -> bool:
        """Whether the password itself crosses the wire: digest sends
        ``user:password`` in its auth packet, SASL PLAIN sends it too;
        SASL DIGEST-MD5 answers a challenge instead."""
        if self.sasl_options is None:
            return True
        return str(self.sasl_options.get("mechanism", "")).upper() == "PLAIN"


def credentials_of(options: ConnectOptions) -> Credentials | None:
    username, password = options.username, options.password
    scheme = options.auth_scheme or ("digest" if username or password else None)
    if scheme is None:
        return None
    if scheme not in ("digest", "sasl"):
        raise ConfigError(f"unknown ZooKeeper auth scheme {scheme!r}: use digest or sasl")
    if not username or password is None:
        raise ConfigError(f"ZooKeeper {scheme} authentication needs both a username and a "
                          f"password: {CREDENTIALS_HOW}")
    secret = password.reveal()
    if scheme == "digest":
        if ":" in username:
            raise ConfigError("a ZooKeeper digest username cannot contain ':'")
        return Credentials("digest", [("digest", f"{username}:{secret}")], None, (secret,))
    sasl = {
        "mechanism": options.extra.get("sasl_mechanism", "DIGEST-MD5"),
        "username": username,
        "password": secret,
    }
    if "sasl_service" in options.extra:
        sasl["service"] = options.extra["sasl_service"]
    return Credentials("sasl", [], sasl, (secret,))


def log_secrets(credentials: Credentials | None, acl: Iterable[ACL]) -> tuple[str, ...]:
    """What kazoo's logs must never show: the password, and every digest hash
    (of the ACL's digest entries, and of our own digest identity, which the
    server puts in the ACL of what we create)."""
    secrets = list(credentials.secrets) if credentials is not None else []
    digests = [a.id.id for a in acl if a.id.scheme == "digest"]
    if credentials is not None and credentials.scheme == "digest":
        user, _, secret = credentials.auth_data[0][1].partition(":")
        digests.append(make_digest_acl_credential(user, secret))
    secrets += [d.partition(":")[2] for d in digests if d.partition(":")[2]]
    return tuple(secrets)


class RedactCredentials(logging.Filter):
    """Keeps credentials out of kazoo's log records.

    kazoo logs every request it sends at DEBUG, authentication packets
    included, and the session password at a lower level. One filter serves
    every coordinator of the process; each registers its secrets while open.
    """

    def __init__(self) -> None:
        super().__init__()
        self._secrets: collections.Counter[str] = collections.Counter()

    @property
    def secrets(self) -> tuple[str, ...]:
        return tuple(self._secrets)

    def add(self, secrets: Iterable[str]) -> None:
        self._secrets.update(s for s in secrets if s)

    def discard(self, secrets: Iterable[str]) -> None:
        self._secrets.subtract(s for s in secrets if s)
        for secret in [s for s, n in self._secrets.items() if n <= 0]:
            del self._secrets[secret]

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and args:
            redact_bytes = "passwd" in str(record.msg)
            record.args = tuple(
                f"{type(a).__name__}(<redacted>)"
                if isinstance(a, Auth | SASL | Connect) or (redact_bytes and isinstance(a, bytes))
                else a
                for a in args
            )
        secrets = self.secrets
        if secrets:
            message = record.getMessage()
            if any(s in message for s in secrets):
                for s in secrets:
                    message = message.replace(s, "***")
                record.msg, record.args = message, None
        return True


REDACTOR: Final = RedactCredentials()
kazoo_log.addFilter(REDACTOR)
