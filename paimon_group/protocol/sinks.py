"""The group's sinks: which targets hold the group's output, for ``describe``.

A sink that keeps its own positions in its target (the Paimon sink's marks)
registers itself in its process for a group when it first writes a batch of
that group (:func:`register`); the group's members in that process publish
it under ``groups/<group>/sinks/<name>`` at their next full control round
(create if absent: one record per target, whoever wrote it first), so
``describe`` can show each shard's position in the target beside its
position in the coordinator. A record names the target only: its warehouse (never with
credentials: a warehouse URI carrying them is refused earlier) and table.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass

from paimon_group.errors import CorruptValue
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.group_reads import GroupReads


@dataclass(frozen=True)
class SinkRecord:
    """A target the group's output is written to."""

    kind: str        # "paimon"
    warehouse: str
    table: str

    @property
    def name(self) -> str:
        """The record's key name: stable for one target."""
        text = f"{self.kind}\0{self.warehouse}\0{self.table}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def encode(self) -> bytes:
        return json.dumps({"kind": self.kind, "warehouse": self.warehouse,
                           "table": self.table}, sort_keys=True).encode()

    @classmethod
    def decode(cls, value: bytes) -> SinkRecord:
        try:
            data = json.loads(value)
            return cls(str(data["kind"]), str(data["warehouse"]), str(data["table"]))
        except (ValueError, TypeError, KeyError) as err:
            raise CorruptValue(f"a sink record does not parse ({err})") from err


_lock = threading.Lock()
_registered: dict[str, dict[str, SinkRecord]] = {}  # group -> name -> record
# (group, name) -> the ids of the sinks that registered it and are not closed
_holders: dict[tuple[str, str], set[int]] = {}


def register(group: str, record: SinkRecord, holder: object = None) -> None:
    """Say that this process writes ``group``'s output to ``record``'s target
    (through ``holder``, a sink, until it :func:`unregister` s)."""
    with _lock:
        _registered.setdefault(group, {})[record.name] = record
        _holders.setdefault((group, record.name), set()).add(id(holder))


def unregister(group: str, record: SinkRecord, holder: object = None) -> None:
    """``holder`` no longer writes ``group``'s output (it closed): the record
    leaves the process's registry with its last holder (a record published
    already stays in the group, for ``describe``). Without it a long-lived
    process that opens a sink after another kept publishing every closed
    one's target at each full control round."""
    with _lock:
        holders = _holders.get((group, record.name))
        if holders is None:
            return
        holders.discard(id(holder))
        if not holders:
            del _holders[(group, record.name)]
            known = _registered.get(group, {})
            known.pop(record.name, None)
            if not known:
                _registered.pop(group, None)


def registered(group: str) -> list[SinkRecord]:
    """The sinks this process writes ``group``'s output to, in name order."""
    with _lock:
        known = _registered.get(group, {})
        return [known[name] for name in sorted(known)]


async def publish(client: GroupClient, records: list[SinkRecord]) -> None:
    """Publish ``records`` in the group (each created if absent)."""
    for record in records:
        await client.coordinator.create(client.keys.sink(record.name), record.encode())


async def read(client: GroupReads) -> list[SinkRecord]:
    """The group's published sinks."""
    return [SinkRecord.decode(e.value)
            for e in await client.coordinator.list(client.keys.sinks_dir)]
