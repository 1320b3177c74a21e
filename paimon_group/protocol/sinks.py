"""The group's sinks: which targets hold the group's output, for ``describe``.

A sink that keeps its own positions in its target (the Paimon sink's marks)
registers itself with a member when it first writes a batch that member
delivered (in the member's :class:`SinkRegistry`, which the batch carries);
the member publishes it under ``groups/<group>/sinks/<name>`` at its next
full control round (create if absent: one record per target, whoever wrote
it first), so ``describe`` can show each shard's position in the target
beside its position in the coordinator. A record names the target only: its
warehouse (never with credentials: a warehouse URI carrying them is refused
earlier) and table. A batch no member delivered carries no registry: its
sink is published by nobody.
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


class SinkRegistry:
    """The sinks one member's output is written to, until they close.

    Each member has its own (``MemberCore.sinks``) and hands it to the sinks
    with every batch it delivers (``ShardBatch.sinks``): a sink registers
    itself at its first write of a batch of that member (:meth:`register`)
    and leaves at its close (:meth:`unregister`); the member publishes
    :meth:`records` in its group at its next full control round
    (:func:`publish`). Thread-safe: the member's handlers register from
    their threads while its control loop reads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, SinkRecord] = {}  # name -> record
        # name -> the ids of the sinks that registered it and are not closed
        self._holders: dict[str, set[int]] = {}

    def register(self, record: SinkRecord, holder: object = None) -> None:
        """Say that this member's output is written to ``record``'s target
        (through ``holder``, a sink, until it :meth:`unregister` s)."""
        with self._lock:
            self._records[record.name] = record
            self._holders.setdefault(record.name, set()).add(id(holder))

    def unregister(self, record: SinkRecord, holder: object = None) -> None:
        """``holder`` no longer writes this member's output (it closed): the
        record leaves the registry with its last holder (a record published
        already stays in the group, for ``describe``). Without it a member
        whose process opens a sink after another kept publishing every closed
        one's target at each full control round."""
        with self._lock:
            holders = self._holders.get(record.name)
            if holders is None:
                return
            holders.discard(id(holder))
            if not holders:
                del self._holders[record.name]
                self._records.pop(record.name, None)

    def records(self) -> list[SinkRecord]:
        """The sinks this member's output is written to, in name order."""
        with self._lock:
            return [self._records[name] for name in sorted(self._records)]


async def publish(client: GroupClient, records: list[SinkRecord]) -> None:
    """Publish ``records`` in the group (each created if absent)."""
    for record in records:
        await client.coordinator.create(client.keys.sink(record.name), record.encode())


async def read(client: GroupReads) -> list[SinkRecord]:
    """The group's published sinks."""
    return [SinkRecord.decode(e.value)
            for e in await client.coordinator.list(client.keys.sinks_dir)]
