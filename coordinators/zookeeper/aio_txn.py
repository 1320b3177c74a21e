"""The multis of the asyncio client: kazoo's write ``multi`` committed as a future, and
the read-only ``multiRead`` of ZooKeeper 3.6+ (kazoo has none)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import EXCEPTIONS
from kazoo.protocol.serialization import (
    CheckVersion,
    Create,
    Delete,
    GetChildren,
    GetData,
    MultiHeader,
    SetData,
    Transaction,
    ZnodeStat,
    int_struct,
    read_buffer,
    read_string,
    stat_struct,
)
from kazoo.security import ACL

_ERROR = -1  # a MultiHeader's type for a failed operation (ZooDefs.OpCode.error)


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


class MultiRead:
    """``GetData`` of each path in one request (ZooKeeper's ``multiRead``, opcode 22).

    Written as the write ``multi`` is (kazoo's :class:`Transaction`): a
    ``MultiHeader`` and a ``GetDataRequest`` (path, no watch) per path, then
    the closing header. The server reads each path in order and answers each
    on its own: a failed read fails no other. The reply, in path order, is
    per path either ``(data, stat)`` as :class:`GetData` decodes it or the
    kazoo exception of its error code (``NoNodeError`` for a missing znode).
    Needs ZooKeeper 3.6+; older servers answer ``UnimplementedError`` and
    close the connection.
    """

    type = 22

    def __init__(self, paths: tuple[str, ...]) -> None:
        self.paths = paths

    def __repr__(self) -> str:
        return f"MultiRead(paths={list(self.paths)!r})"

    def serialize(self) -> bytearray:
        body = bytearray()
        for path in self.paths:
            body += MultiHeader(GetData.type, False, -1).serialize()
            body += GetData(path, None).serialize()
        body += MultiHeader(-1, True, -1).serialize()
        return body

    @classmethod
    def deserialize(cls, data: bytes, offset: int) -> list[Any]:
        results: list[Any] = []
        header, offset = MultiHeader.deserialize(data, offset)
        while not header.done:
            if header.type == GetData.type:
                value, offset = read_buffer(data, offset)
                stat = ZnodeStat._make(stat_struct.unpack_from(data, offset))
                offset += stat_struct.size
                results.append((value, stat))
            elif header.type == GetChildren.type:
                (count,) = int_struct.unpack_from(data, offset)
                offset += int_struct.size
                children = []
                for _ in range(max(count, 0)):
                    child, offset = read_string(data, offset)
                    children.append(child)
                results.append(children)
            elif header.type == _ERROR:
                (code,) = int_struct.unpack_from(data, offset)
                offset += int_struct.size
                results.append(EXCEPTIONS[code]())
            else:
                raise ValueError(f"a multiRead reply holds an operation of type {header.type}")
            header, offset = MultiHeader.deserialize(data, offset)
        return results
