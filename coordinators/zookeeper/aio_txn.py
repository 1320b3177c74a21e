"""A ``multi`` for the asyncio client: kazoo's ``TransactionRequest``, committed as a future."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from kazoo.protocol.serialization import CheckVersion, Create, Delete, SetData, Transaction
from kazoo.security import ACL


class AioTransaction:
    """The operations of one ``multi``, sent by :meth:`commit_async`.

    The same builder calls as kazoo's (``create``, ``delete``, ``set_data``,
    ``check``); the reply is kazoo's too: one result per operation, an
    exception instance for each failed or rolled back one.
    """

    def __init__(self, call: Callable[[Any], asyncio.Future[Any]]) -> None:
        self._call = call
        self._ops: list[Any] = []
        self._committed = False

    def create(
        self, path: str, value: bytes = b"", acl: list[ACL] | None = None,
        ephemeral: bool = False, sequence: bool = False,
    ) -> None:
        flags = (1 if ephemeral else 0) | (2 if sequence else 0)
        self._ops.append(Create(path, value, list(acl or []), flags))

    def delete(self, path: str, version: int = -1) -> None:
        self._ops.append(Delete(path, version))

    def set_data(self, path: str, value: bytes, version: int = -1) -> None:
        self._ops.append(SetData(path, value, version))

    def check(self, path: str, version: int) -> None:
        self._ops.append(CheckVersion(path, version))

    def commit_async(self) -> asyncio.Future[Any]:
        if self._committed:
            raise ValueError("Transaction already committed")
        self._committed = True
        return self._call(Transaction(self._ops))
