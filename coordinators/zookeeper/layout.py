"""The znodes of a key (value, flag, epoch marker), and the records a commit
is planned with."""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass
from typing import Final, Literal

from coordinators.errors import ConfigError
from coordinators.protocol import (
    validate_dir,
    validate_key,
)

RESERVED_PREFIX: Final = ".pg-"
FLAG_PREFIX: Final = ".pg-key."
EPOCH_PREFIX: Final = ".pg-epoch."
NONCE = re.compile(r"[0-9a-f]{32}")
# How many (key, create_version) -> nonce entries a coordinator remembers.
_EPOCH_CACHE_SIZE: Final = 4096

# ------------------------------------------------------------------ planning


@dataclass(frozen=True, slots=True)
class KeyState:
    """What a key looks like on the server (read before a write)."""

    kind: Literal["absent", "dir", "key"]
    nonce: str = ""
    create_version: int = 0
    ephemeral: bool = False
    data_version: int = 0
    mzxid: int = 0
    children: int = 0
    value: bytes = b""
    # Created by an earlier operation of the transaction being planned.
    new: bool = False


ASSUMED_KEY: Final = KeyState("key")


@dataclass(frozen=True, slots=True)
class TxnOp:
    kind: Literal["create", "delete", "set", "check"]
    path: str
    key: str
    explicit: bool  # a caller's Check (failure: commit returns False)
    data: bytes = b""
    version: int = -1
    ephemeral: bool = False


class Txn:
    """The operations of one ``multi`` and where each came from."""

    def __init__(self) -> None:
        self.ops: list[TxnOp] = []

    def add(self, op: TxnOp) -> None:
        self.ops.append(op)


@dataclass(frozen=True, slots=True)
class Failure:
    op: TxnOp
    error: BaseException

def child_znode(directory: str, name: str) -> str:
    return f"{directory}{name}" if directory.endswith("/") else f"{directory}/{name}"

class Layout:
    """Where a key's znodes are (see "Znode layout" in the package docstring)."""

    _prefix: str
    _root: str
    _epochs: collections.OrderedDict[tuple[str, int], str]

    def _check_key(self, key: str) -> str:
        validate_key(key)
        self._check_segments(key, key.split("/"))
        return key

    def _check_dir(self, prefix: str) -> str:
        validate_dir(prefix)
        self._check_segments(prefix, prefix[:-1].split("/") if prefix else [])
        return prefix

    def _check_segments(self, shown: str, segments: list[str]) -> None:
        for segment in segments:
            if segment in (".", "..") or segment.startswith(RESERVED_PREFIX):
                raise ConfigError(
                    f"invalid coordinator key {shown!r} for ZooKeeper: path segments '.', '..' "
                    f"and those starting with {RESERVED_PREFIX!r} are reserved"
                )
        if not self._prefix and segments and segments[0] == "zookeeper":
            raise ConfigError(
                f"invalid coordinator key {shown!r}: /zookeeper is ZooKeeper's own tree; "
                "use a chroot in the URL"
            )

    def _znode(self, key: str) -> str:
        return f"{self._prefix}/{key}"

    def _dir_znode(self, head: str) -> str:
        """The znode of directory ``head/`` (``""``: the chroot itself)."""
        return f"{self._prefix}/{head}" if head else self._root

    def _parent_znode(self, key: str) -> str:
        return self._dir_znode(key.rpartition("/")[0])

    def _sibling(self, key: str, name: str) -> str:
        return child_znode(self._parent_znode(key), name)

    def _flag(self, key: str) -> str:
        return self._sibling(key, FLAG_PREFIX + key.rpartition("/")[2])

    def _epoch(self, key: str, nonce: str) -> str:
        return self._sibling(key, EPOCH_PREFIX + nonce)

    def _remember_epoch(self, key: str, create_version: int, nonce: str) -> None:
        self._epochs[(key, create_version)] = nonce
        self._epochs.move_to_end((key, create_version))
        while len(self._epochs) > _EPOCH_CACHE_SIZE:
            self._epochs.popitem(last=False)
