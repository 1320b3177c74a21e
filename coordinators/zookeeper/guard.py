"""Znodes that exist before we would create them: their ACLs must be ours.

Every directory znode a coordinator uses is one it would create, with its
ACL, if it were missing: the chroot, and each directory between the chroot and
a key (for a group: ``groups``, ``groups/<group>``, ``groups/<group>/owners``,
...). Whoever may create or delete the children of a directory, or rewrite
its data, can forge, delete or rewrite the keys in it; so a directory that
already exists is used only if its ACL grants nothing beyond what our own ACL
would: the **rule** is that every entry's permissions must be covered by the
entries our configured ``acl`` yields, ``creator`` standing for the session's
own identities (its digest ``USER:HASH``, its SASL user, and the x509 subject
of its TLS client certificate, as the server reports it), and a
``world:anyone`` entry of ours covering everybody (``acl=open`` accepts
anything). A refusal is one line naming the znode and its ACL (digest hashes
masked).

When: the chroot at ``connect()`` (after creating it if missing, so a chroot
someone else made meanwhile is caught too); any other directory the first time
this coordinator reads, lists, creates, commits or deletes a key in it, before
the request is sent (a missing directory of a write is created first with our
ACL, then checked with the whole chain again). A directory found acceptable
is not looked at again by this coordinator. The chroot's own parents are not
checked: ZooKeeper's root is world-writable by default, and a parent holds
only the chroot, which nobody can delete once it has children and whose own
ACL is checked. A key's own znodes are not checked either: they live in a
directory that lets only our identities create them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kazoo.exceptions import KazooException, NoNodeError
from kazoo.protocol.serialization import int_struct, read_string
from kazoo.security import ACL, Id, Permissions, make_digest_acl_credential

from coordinators.acls import show_acl_entry
from coordinators.errors import ConfigError, CoordinatorError
from coordinators.zookeeper.core import ZkCore, log
from coordinators.zookeeper.layout import Layout
from coordinators.zookeeper.security import Credentials

WORLD: Id = Id("world", "anyone")
_LETTERS = (
    ("c", Permissions.CREATE),
    ("r", Permissions.READ),
    ("w", Permissions.WRITE),
    ("d", Permissions.DELETE),
    ("a", Permissions.ADMIN),
)


class ForeignAcl(ConfigError, CoordinatorError):
    """A znode we would have created with our ACL exists with another one."""


def show_acl(acl: ACL) -> str:
    """``SCHEME:ID:PERMS`` (``crwda`` letters), a digest hash masked."""
    perms = "".join(letter for letter, bit in _LETTERS if acl.perms & bit) or "-"
    return show_acl_entry(f"{acl.id.scheme}:{acl.id.id}:{perms}")


def show_acls(acls: Iterable[ACL]) -> str:
    return ",".join(show_acl(a) for a in acls) or "(empty)"


def identities_of(credentials: Credentials | None, x509: Iterable[str] = ()) -> frozenset[Id]:
    """The ids ZooKeeper gives a session with these credentials: what ``creator``
    (``auth``) entries become."""
    ids = {Id("x509", subject) for subject in x509}
    if credentials is not None and credentials.scheme == "digest":
        user, _, secret = credentials.auth_data[0][1].partition(":")
        ids.add(Id("digest", make_digest_acl_credential(user, secret)))
    elif credentials is not None and credentials.sasl_options:
        ids.add(Id("sasl", credentials.sasl_options["username"]))
    return frozenset(ids)


def grants_of(configured: Iterable[ACL], identities: Iterable[Id]) -> dict[Id, int]:
    """The permissions our ACL grants each id (``auth`` expanded to ``identities``)."""
    ours = tuple(identities)
    grants: dict[Id, int] = {}
    for entry in configured:
        for ident in ours if entry.id.scheme == "auth" else (entry.id,):
            grants[ident] = grants.get(ident, 0) | entry.perms
    return grants


def foreign_entries(acls: Iterable[ACL], grants: dict[Id, int]) -> list[ACL]:
    """The entries of ``acls`` that grant more than ``grants`` would."""
    everyone = grants.get(WORLD, 0)
    return [a for a in acls if a.perms & ~(grants.get(a.id, 0) | everyone)]


class WhoAmI:
    """ZooKeeper's ``whoAmI`` request (3.7+): the session's ``(scheme, id)`` pairs
    (kazoo sends any object with a ``type``, ``serialize`` and ``deserialize``)."""

    type = 107

    def __repr__(self) -> str:
        return "WhoAmI()"

    @classmethod
    def serialize(cls) -> bytes:
        return b""

    @classmethod
    def deserialize(cls, buffer: bytes, offset: int) -> list[tuple[str, str]]:
        count = int_struct.unpack_from(buffer, offset)[0]
        offset += int_struct.size
        found = []
        for _ in range(max(count, 0)):
            scheme, offset = read_string(buffer, offset)
            ident, offset = read_string(buffer, offset)
            found.append((scheme or "", ident or ""))
        return found


def who_am_i_async(client: Any) -> Any:
    call = getattr(client, "call_async", None)
    if call is not None:  # the asyncio client: a future of the loop
        return call(WhoAmI())
    result = client.handler.async_result()
    client._call(WhoAmI(), result)
    return result


class AclGuard(Layout, ZkCore):
    """Checks the ACL of the directory znodes before their first use."""

    # Directories (relative heads; "" is the chroot) found acceptable.
    _trusted: set[str]
    _grants: dict[Id, int] | None

    async def _learn_identities(self) -> None:
        """Our ids as the server sees them, and what our ACL grants each."""
        x509: list[str] = []
        if self._options.tls_cert is not None:
            client = self._live_client()
            try:
                pairs = await self._request("ask ZooKeeper who we are", who_am_i_async, client)
                x509 = [ident for scheme, ident in pairs if scheme == "x509"]
            except (KazooException, CoordinatorError) as err:  # before 3.7: no whoAmI
                log.debug("ZooKeeper did not tell our x509 identity: %r", err)
        identities = identities_of(self._credentials, x509)
        self._grants = grants_of(self._acl, identities)

    def _open_to_all(self) -> bool:
        grants = self._grants or {}
        return bool(grants.get(WORLD, 0) == Permissions.ALL)

    async def _guard(self, heads: Iterable[str], *, create: bool = False) -> None:
        """Check each directory ``head`` (and those above it) once; with
        ``create``, make the missing ones first (with our ACL)."""
        trusted = self._trusted
        wanted = [h for h in heads if h not in trusted]
        if not wanted or self._open_to_all():
            return
        chain = [c for h in dict.fromkeys(wanted) for c in _chain(h) if c not in trusted]
        todo = list(dict.fromkeys(chain))
        missing = await self._judge(todo)
        if not missing or not create:
            return
        client = self._live_client()
        for head in missing:
            if not any(other.startswith(head + "/") for other in missing):
                await self._request(
                    f"create {head}/", client.ensure_path_async, self._dir_znode(head),
                    list(self._acl),
                )
        # Made by us, or by someone else in between: look at the chain again
        # (the chroot too, which holds something now and can no longer be
        # deleted and made again by another).
        await self._judge(([""] if self._prefix else []) + todo)

    async def _judge(self, heads: list[str]) -> list[str]:
        """Check the ACLs of ``heads`` (pipelined); the missing ones, in order."""
        client = self._live_client()
        sent = [self._send(client.get_acls_async, self._dir_znode(h)) for h in heads]
        replies = await self._recv_all(sent, "read ACLs")
        missing = []
        for head, reply in zip(heads, replies, strict=True):
            if isinstance(reply, NoNodeError):
                missing.append(head)
                continue
            if isinstance(reply, BaseException):
                raise reply
            self._check_acls(self._dir_znode(head), reply[0])
            self._trusted.add(head)
        return missing

    def _check_acls(self, path: str, acls: list[ACL]) -> None:
        grants = self._grants or {}
        if not foreign_entries(acls, grants):
            return
        ours = [ACL(perms, ident) for ident, perms in grants.items()]
        raise ForeignAcl(
            f"ZooKeeper znode {path} exists with an ACL that is not ours: {show_acls(acls)} "
            f"(ours: {show_acls(ours)}); whoever it names could forge, rewrite or delete the "
            f"keys below it: give it our ACL (setAcl), or delete it, or opt into open ACLs "
            "with ?acl=open (development servers only)"
        )


def _chain(head: str) -> list[str]:
    """``a/b/c`` -> ``a``, ``a/b``, ``a/b/c`` (the chroot, ``""``, is not in it)."""
    parts = head.split("/") if head else []
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]
