"""The group's sinks: which targets hold the group's output, for ``describe``.

A sink that keeps its own positions in its target (the Paimon sink's marks)
registers itself in its process (:func:`register`); a member publishes its
process's sinks under ``groups/<group>/sinks/<name>`` when it joins (create
if absent: one record per target, whoever wrote it first), so ``describe``
can show each shard's position in the target beside its position in the
coordinator. A record names the target only: its warehouse (never with
credentials: a warehouse URI carrying them is refused earlier) and table.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass

from paimon_group.errors import CorruptValue
from paimon_group.protocol.group import GroupClient


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
_registered: dict[str, SinkRecord] = {}


def register(record: SinkRecord) -> None:
    """Say that this process writes the output of its members to ``record``'s target."""
    with _lock:
        _registered[record.name] = record


def registered() -> list[SinkRecord]:
    """This process's sinks, in the order of their names."""
    with _lock:
        return [_registered[name] for name in sorted(_registered)]


async def publish(client: GroupClient, records: list[SinkRecord]) -> None:
    """Publish ``records`` in the group (each created if absent)."""
    for record in records:
        await client.coordinator.create(client.keys.sink(record.name), record.encode())


async def read(client: GroupClient) -> list[SinkRecord]:
    """The group's published sinks."""
    return [SinkRecord.decode(e.value)
            for e in await client.coordinator.list(client.keys.sinks_dir)]
