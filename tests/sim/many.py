"""A group of several tables in the seeded simulation.

In some seeds (:meth:`ManyPlan.draw`, its own draw: a seed that draws one
table runs as it always did) the group reads every table of the database
``db`` (``--table 'db.*'``): the seed's table ``db.t`` and one to three more
(``db.t1`` ..., each of a kind of :data:`tests.sim.table.KINDS`, each with
its own writer replaying its template's commits at its own instants). During
the chaos a table may be created (``db.tN``: the leader's next listing, every
``tables_refresh_s`` of 1 or 2 virtual seconds, gives it a range, and all of
its rows from the group's start on are delivered), and one of the first
tables may be dropped, and re-created under its name (a new identity: a new
range; the old one stays dropped).

The members, their faults and their schedule are those of a run of one table
(:class:`tests.sim.scenario.Run`, on the same virtual clock); snapshot
expiry, coordinator switches and wipes, the Paimon sink and the members
driven as the Spark source are not drawn for these seeds.

A delivered row is named ``ordinal * TAG + id`` (a table's ids are its
template's, the same in every table), so the history checker of one table
runs over all of them at once, in the group's shard numbers: epochs,
commits, positions and duplicates per group shard. On top:

* every row of every table still there at the end, from where its shard's
  position was first pinned, is delivered (``lost``; the settle waits for
  them); a row of a dropped table need not be: what was delivered of it is
  what was written (``unknown_rows``), under the same duplicate and epoch
  checks as any;
* each row is delivered by its own table's shard: ``batch.shard`` the shard
  of the row by that table's rule and shard count, ``batch.group_shard`` that
  shard plus the first of its table's range in the group's map
  (``wrong_shard``);
* the group's map ends with one live range for each table there (its name
  and identity), each dropped life's range marked dropped (``table_map``),
  and no shard of a dropped range owned (the settle waits for it);
* nothing of a dropped table is delivered later than
  :data:`~tests.sim.scenario.DROP_NOTICE_BOUND_S` after its drop, and no
  member fails (the group goes on with the other tables);
* the kind's values (a key's latest version, a first-row key's first) and
  the added column, per table.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paimon_group import MemberConfig
from paimon_group.protocol.table_map import TableMap, TableRange
from tests.sim.expiry import ExpiryPlan
from tests.sim.loop import SimClock
from tests.sim.scenario import (
    CHAOS_S,
    DROP_NOTICE_BOUND_S,
    GROUP,
    SETTLE_BOUND_S,
    Incarnation,
    Run,
)
from tests.sim.sink import SinkPlan
from tests.sim.table import (
    ALTER_BEFORE,
    KIND_WEIGHTS,
    KINDS,
    PK_KINDS,
    ReplayWarehouse,
    Template,
    templates,
)
from tests.support import checker

TAG = 10_000  # a row of table ``ordinal`` is named ``ordinal * TAG + id``
SINGLE_TABLE_FINDINGS = frozenset((
    14, 17, 26, 43, 44, 45, 51, 55, 78, 79, 84, 92, 103, 141, 167, 205, 225, 230, 263, 286,
    345, 359, 376, 381, 399, 406, 407, 418, 611, 1119, 1126, 1259, 1943, 4300, 5877, 6569,
    8366, 10369, 11416, 11431, 11491, 12300, 13004, 15757, 17287, 17462, 19902, 35083,
    100121, 201398, 205919, 205949, 206397, 207074, 208677, 228007, 243174, 243848, 244687,
    244843, 247746, 286400, 298848, 300686, 301489, 301795, 305872, 311532, 312929, 329010,
    500088, 502414, 520586, 522610, 564249))
"""Seeds that docs/reliability.md and the tests name for a finding on a group
of one table: they stay one table's, so that each keeps its meaning."""
MANY_PLANTS = (None, "stale_fence", "drop_delivery")
"""The plants whose seeds may draw several tables (the others run their seeds
as they were)."""


@dataclass(frozen=True)
class ManyPlan:
    """What a seed draws for a group of several tables (see the module docstring)."""

    on: bool
    extra: tuple[str, ...] = ()  # kinds of db.t1 ... (db.t is of the seed's kind)
    create: str | None = None  # the kind of a table created during the chaos
    create_at: float = 0.0
    drop: int | None = None  # which of the first tables is dropped
    drop_at: float = 0.0
    recreate_after: float | None = None  # re-created under its name this long after
    refresh_s: float = 1.0

    @classmethod
    def draw(cls, seed: int, plant: str | None = None) -> ManyPlan:
        """Half the seeds without the Paimon sink (a third of all), under no
        plant or one of :data:`MANY_PLANTS`: the sink's seeds (the
        afterlife's among them) and :data:`SINGLE_TABLE_FINDINGS` stay as
        they were."""
        rng = random.Random(f"tables:{seed}")
        if rng.random() >= 0.5 or plant not in MANY_PLANTS or SinkPlan.draw(seed).on \
                or seed in SINGLE_TABLE_FINDINGS:
            return cls(False)
        extra = tuple(rng.choices(KINDS, KIND_WEIGHTS, k=rng.choice([1, 2, 3])))
        create = rng.choices(KINDS, KIND_WEIGHTS)[0] if rng.random() < 0.5 else None
        create_at = rng.uniform(1.0, CHAOS_S * 0.8)
        drop = rng.randrange(1 + len(extra)) if rng.random() < 0.5 else None
        drop_at = rng.uniform(CHAOS_S / 4, CHAOS_S * 0.9)
        recreate_after = rng.choice([0.0, 0.5, 3.0]) if rng.random() < 0.4 else None
        return cls(True, extra, create, create_at, drop, drop_at, recreate_after,
                   rng.choice([1.0, 2.0]))

    def kinds(self) -> list[str]:
        """The kinds whose templates the run links in besides the seed's own."""
        return [*self.extra, *([self.create] if self.create else [])] if self.on else []


def identity(template: Template) -> str:
    """The identity (protocol/identity.py) of a table linked from ``template``."""
    data = json.loads((template.table_dir / "schema" / "schema-0").read_text())
    return f"schema-{int(data['id'])}@{int(data['timeMillis'])}"


@dataclass
class SimTable:
    """One table of the run: ``db.<name>``, its writer and what it wrote.

    A table has one life (its ``main`` template, ids below 1000) or two, when
    it was dropped and re-created (the ``recreated`` template, ids from 1000)."""

    ordinal: int
    name: str
    kind: str
    wh: ReplayWarehouse
    created_at: float
    dropped_at: float | None = None  # of its first life
    recreated_at: float | None = None
    # raw id -> [(snapshot, v)] of every version committed (both lives)
    versions: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    @property
    def full(self) -> str:
        return f"db.{self.name}"

    def tag(self, i: int) -> int:
        return self.ordinal * TAG + i

    def life(self, i: int) -> int:
        return 0 if i in self.wh.main.first_loc else 1

    def template(self, life: int) -> Template:
        return self.wh.main if life == 0 else self.wh.recreated

    @property
    def live_life(self) -> int | None:
        """The life still there at the end (None: dropped for good)."""
        if self.recreated_at is not None:
            return 1
        return None if self.dropped_at is not None else 0

    def commit(self) -> int | None:
        n = self.wh.commit()
        if n is not None:
            current = self.wh.current
            for i in current.ids[n]:
                self.versions.setdefault(i, []).append((n, current.values[n]))
        return n


class ManyRun(Run):
    """A run of a group of several tables (see the module docstring)."""

    drivers = False

    def __init__(self, seed: int, root: Path, plant: str | None, clock: SimClock,
                 plan: ManyPlan) -> None:
        super().__init__(seed, root, plant, clock)
        self.many = plan
        self.expiry = ExpiryPlan("off", 1, None, "fail", 0.0)
        self.switch = None
        self.wipe_at_pin = False
        self.table_fate = "many"
        self.trng = random.Random(f"tables-run:{seed}")
        self.tables = [SimTable(0, "t", self.kind, self.wh, 0.0)]
        for kind in plan.extra:
            self._add_table(kind, 0.0)
        self.stats["many_tables"] = len(self.tables)
        self._identities: dict[tuple[str, int], str] = {}

    def _add_table(self, kind: str, at: float) -> SimTable:
        ordinal = len(self.tables)
        main, recreated = templates(kind)
        wh = ReplayWarehouse(self.wh.root, main, recreated, name=f"t{ordinal}")
        table = SimTable(ordinal, f"t{ordinal}", kind, wh, at)
        self.tables.append(table)
        return table

    def by_name(self, name: str) -> SimTable:
        return next(t for t in self.tables if t.full == name)

    def _config(self, member_id: str, number: int) -> MemberConfig:
        return dataclasses.replace(super()._config(member_id, number), table="db.*",
                                   shards=None, tables_refresh_s=self.many.refresh_s)

    def _record(self, inc: Incarnation, batch: Any) -> tuple[Any, dict[str, Any] | None]:
        rows, record = super()._record(inc, batch)
        if record is not None:
            table = self.by_name(batch.table)
            record.update(table=batch.table, local=batch.shard, shard=batch.group_shard,
                          raw=record["ids"], ids=[table.tag(i) for i in record["ids"]])
        return rows, record

    def table_dropped_under(self, batch: Any) -> bool:
        return self.by_name(batch.table).dropped_at is not None

    # -- the schedule

    def _write_times(self, table: SimTable, since: float) -> list[float]:
        out, at = [], since
        for _ in range(table.wh.remaining):
            at += self.trng.uniform(0.2, CHAOS_S / 6)
            out.append(min(at, CHAOS_S))
        return out

    def _writes_later(self, table: SimTable) -> None:
        loop = asyncio.get_running_loop()
        for at in self._write_times(table, 0.0):
            loop.call_later(at, table.commit)

    async def chaos(self) -> None:
        rng, plan = self.rng, self.many
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for table in self.tables:
            for _ in range(self.trng.choice([0, 1, 2])):
                table.commit()
        events: list[tuple[float, str, SimTable | None]] = [
            (at, "write", t) for t in self.tables for at in self._write_times(t, 0.0)]
        for _ in range(rng.randint(2, 7)):
            events.append((rng.uniform(0, CHAOS_S), rng.choice(
                ["join", "join", "leave", "crash", "crash", "pause", "restart"]), None))
        if plan.create is not None:
            events.append((plan.create_at, "create", None))
        if plan.drop is not None:
            dropped = self.tables[plan.drop]
            events.append((plan.drop_at, "drop", dropped))
            if plan.recreate_after is not None:
                events.append((plan.drop_at + plan.recreate_after, "recreate", dropped))
        events.sort(key=lambda e: e[0])
        for _ in range(rng.randint(1, 3)):
            await self.start_member(self._free_id() or "m0")
        for at, what, subject in events:
            wait = t0 + at - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            await self._table_event(what, subject)
        await asyncio.sleep(max(0.0, t0 + CHAOS_S - loop.time()))

    async def _table_event(self, what: str, table: SimTable | None) -> None:
        now = self.clock.monotonic()
        if what == "write" and table is not None:
            table.commit()
        elif what == "create" and self.many.create is not None:
            created = self._add_table(self.many.create, now)
            self.stats["many_table_created"] += 1
            self._writes_later(created)
        elif what == "drop" and table is not None:
            table.wh.drop()
            table.dropped_at = now
            self.stats["many_table_dropped"] += 1
        elif what == "recreate" and table is not None:
            table.wh.recreate()
            table.recreated_at = now
            self.stats["many_table_recreated"] += 1
            self._writes_later(table)
        else:
            await self._event(what)

    # -- the settle

    async def settle(self) -> None:
        """Faults off; every live table's rows delivered and its shards'
        positions at its latest snapshot, the dropped ranges' shards owned by
        nobody, within the bound."""
        self.plan.enabled = False
        loop = asyncio.get_running_loop()
        for table in self.tables:
            while table.commit() is not None:
                pass
        if not self.live():
            await self.start_member(self._free_id() or "m0")
        started = loop.time()
        while True:
            missing = self.expected_ids() - {i for d in self.deliveries for i in d["ids"]}
            behind = self._behind()
            if self._failed():
                return  # reported by the liveness check
            if not missing and not behind:
                self.stats["settled_after_s"] = round(loop.time() - started, 3)
                return
            if loop.time() > started + SETTLE_BOUND_S:
                self.violations["hang"].append(
                    f"not settled {SETTLE_BOUND_S:.0f}s after the faults stopped: "
                    f"{len(missing)} rows undelivered (e.g. {sorted(missing)[:5]}), {behind}; "
                    f"owners {self._owners()}; live {[i.member_id for i in self.live()]}; "
                    f"map {self._map_text()}")
                return
            if not self.live():
                await self.start_member(self._free_id() or "m0")
            await asyncio.sleep(0.25)

    def _behind(self) -> dict[str, Any]:
        """What keeps the group from settled: each live table's shards whose
        stored position is not its latest snapshot's, a live table without
        its range, a dropped table's range still live, a dropped range's
        shards still owned."""
        tables = self.table_map()
        if tables is None:
            return {"group": "no record"}
        positions = self._stored_positions()
        out: dict[str, Any] = {}
        for table in self.tables:
            if table.dropped_at is not None and self.live_range(table, 0, tables):
                out[f"{table.full} (dropped)"] = "its range still live"
            life = table.live_life
            if life is None:
                continue
            rng = self.live_range(table, life, tables)
            if rng is None:
                out[table.full] = "not in the group's map"
                continue
            latest = (table.wh.committed + 1, None)
            behind = {k: positions.get(k) for k in range(rng.first, rng.end)
                      if positions.get(k) != latest}
            if behind:
                out[table.full] = f"positions {behind}, latest {latest}"
        dropped = {k for r in tables.ranges if not r.live for k in range(r.first, r.end)}
        owned = sorted(set(self._owners()) & dropped)
        if owned:
            out["dropped ranges owned"] = owned
        return out

    # -- the group's map

    def table_map(self) -> TableMap | None:
        entry = self.store.get(f"groups/{GROUP}")
        if entry is None:
            return None
        raw = json.loads(entry.value).get("tables")
        return None if raw is None else TableMap.decode(raw)

    def _map_text(self) -> str:
        tables = self.table_map()
        return "none" if tables is None else str(
            [(r.name, r.first, r.shards, r.live) for r in tables.ranges])

    def identity(self, table: SimTable, life: int) -> str:
        key = (table.name, life)
        if key not in self._identities:
            self._identities[key] = identity(table.template(life))
        return self._identities[key]

    def ranges(self, table: SimTable, life: int, tables: TableMap | None) -> list[TableRange]:
        """The ranges of ``table``'s life ``life`` in the map (its name and identity)."""
        if tables is None:
            return []
        ident = self.identity(table, life)
        return [r for r in tables.ranges if r.name == table.full and r.table_id == ident]

    def live_range(self, table: SimTable, life: int, tables: TableMap | None
                   ) -> TableRange | None:
        return next((r for r in self.ranges(table, life, tables) if r.live), None)

    # -- the checks

    def expected_ids(self) -> set[int]:
        """The rows the group must deliver: each live table's rows from where
        its shard's position was first pinned (see Run.expected_ids)."""
        first: dict[int, tuple[int, int | None]] = {}
        for w in self.store.position_log:
            first.setdefault(w.shard, (w.next_snapshot, w.full_scan))
        tables = self.table_map()
        out: set[int] = set()
        for table in self.tables:
            life = table.live_life
            if life is None:
                continue
            rng = self.live_range(table, life, tables)
            for i, versions in table.versions.items():
                if table.life(i) != life:
                    continue
                shard = None if rng is None else rng.first + table.wh.shard_of(i, rng.shards)
                if shard is None or shard not in first:
                    out.add(table.tag(i))  # never pinned: nothing of it was read
                    continue
                start, full = first[shard]
                if full is not None or any(s >= start for s, _v in versions):
                    out.add(table.tag(i))
        return out

    def excused(self, ids: set[int]) -> dict[int, str]:
        return {}  # no expiry in these seeds

    def _check_history(self, written: set[int], history: checker.History
                       ) -> dict[str, list[str]]:
        found = checker.check_all(set(), history, lambda i: 0, 1, versions=True)
        found["wrong_shard"] = self._check_file_shards()
        found["lost"] = self._lost_rows(written, history)
        return found

    def _lost_rows(self, written: set[int], history: checker.History) -> list[str]:
        bad = sorted(written - set(history.delivered_counts()))
        if not bad:
            return []
        tables = self.table_map()
        out = [f"{len(bad)} rows never delivered, e.g. {bad[:10]}"]
        for tagged in bad[:8]:
            table, i = self.tables[tagged // TAG], tagged % TAG
            rng = self.live_range(table, table.life(i), tables)
            shard = None if rng is None else rng.first + table.wh.shard_of(i, rng.shards)
            out.append(f"{table.full} id {i} (group shard {shard}, versions "
                       f"{table.versions.get(i)}) never delivered; map {self._map_text()}")
        return out

    def _check_file_shards(self) -> list[str]:
        """Each row delivered by its table's shard, in that table's range."""
        tables = self.table_map()
        bad = []
        for d in self.deliveries:
            table = self.by_name(d["table"])
            for i in d["raw"]:
                rngs = self.ranges(table, table.life(i), tables)
                if not any(self._in_shard(table, i, r, d) for r in rngs):
                    bad.append(f"{table.full} id {i} delivered by shard {d['local']} (group "
                               f"shard {d['shard']}); its ranges "
                               f"{[(r.first, r.shards) for r in rngs]}")
        return bad[:10]

    def _in_shard(self, table: SimTable, i: int, rng: TableRange, d: dict[str, Any]) -> bool:
        if d["shard"] != rng.first + d["local"] or not 0 <= d["local"] < rng.shards:
            return False
        if table.kind.startswith("append"):  # the file rule: a compaction moves rows
            return d["local"] in table.wh.shards_of(i, rng.shards)
        return bool(d["local"] == table.wh.shard_of(i, rng.shards))

    def _check_values(self, expected: set[int]) -> list[str]:
        """Each table kind's semantics (Run._check_values), and nothing
        delivered that its table did not write."""
        seen: dict[int, set[int]] = defaultdict(set)
        bad = []
        for d in self.deliveries:
            table = self.by_name(d["table"])
            for i, v in zip(d["raw"], d["vs"], strict=True):
                seen[table.tag(i)].add(v)
                written = [x for _s, x in table.versions.get(i, [])]
                if v not in written:
                    self.violations["unknown_rows"].append(
                        f"{table.full} id {i} v={v} delivered, never written ({written})")
                elif table.kind == "first-row" and d["kind"] == "initial" and v != written[0]:
                    bad.append(f"{table.full} first-row key {i}: full scan delivered v={v}, "
                               f"not the first version v={written[0]}")
        for tagged in sorted(expected):
            table, i = self.tables[tagged // TAG], tagged % TAG
            if table.kind not in PK_KINDS or table.kind == "first-row":
                continue
            want = table.versions[i][-1][1]
            if seen[tagged] and want not in seen[tagged]:
                bad.append(f"{table.full} key {i}: latest version v={want} never delivered "
                           f"(delivered {sorted(seen[tagged])})")
        return bad[:10]

    def _check_schema(self) -> list[str]:
        """Rows a table's first life wrote after its column was added carry it."""
        bad = []
        for d in self.deliveries:
            table = self.by_name(d["table"])
            for pos, i in enumerate(d["raw"]):
                if table.life(i) != 0 or d["vs"][pos] < ALTER_BEFORE:
                    continue
                value = None if d["extra"] is None else d["extra"][pos]
                if value != i * 10:
                    bad.append(f"{table.full} id {i} (write {d['vs'][pos]}) delivered by "
                               f"{d['member']} with extra={value!r}, not {i * 10}")
        return bad[:10]

    def check(self) -> None:
        super().check()
        self.violations["table_map"].extend(self._check_map())
        self.violations["consumer_files"].extend(self._check_consumer_files())
        for table in self.tables:
            if table.dropped_at is None:
                continue
            late = [d for d in self.deliveries if d["table"] == table.full
                    and d["t"] > table.dropped_at + DROP_NOTICE_BOUND_S
                    and any(table.life(i) == 0 for i in d["raw"])]
            if late:
                self.violations["table_change_unnoticed"].append(
                    f"{late[0]['member']} delivered rows of the dropped {table.full} "
                    f"t+{late[0]['t'] - table.dropped_at:.1f}s after its drop")
        self.stats["many_tables_total"] = len(self.tables)

    def _check_consumer_files(self) -> list[str]:
        """Each live table's consumer files are its own shards' (named by the
        table's shard numbers, as a group of that table alone names them),
        none ahead of the position its group shard has in the coordinator."""
        tables = self.table_map()
        positions = self._stored_positions()
        bad = []
        for table in self.tables:
            life = table.live_life
            rng = None if life is None else self.live_range(table, life, tables)
            directory = table.wh.table_dir / "consumer"
            if rng is None or not directory.is_dir():
                continue
            for path in sorted(directory.glob(f"consumer-pg-{GROUP}-shard-*")):
                local = int(path.name.rsplit("-", 1)[1])
                text = path.read_text()
                if not 0 <= local < rng.shards:
                    bad.append(f"{table.full}: {path.name} outside its {rng.shards} shards")
                elif text:
                    self.stats["many_consumer_files"] += 1
                    mirrored = int(json.loads(text)["nextSnapshot"])
                    stored = positions.get(rng.first + local)
                    if stored is None or mirrored > stored[0]:
                        bad.append(f"{table.full}: {path.name} at {mirrored}, the "
                                   f"coordinator's group shard {rng.first + local} at {stored}")
        return bad[:10]

    def _check_map(self) -> list[str]:
        """The group's map at the end: one live range per table there, each
        dropped life's range (if it had one) marked dropped."""
        tables = self.table_map()
        if tables is None:
            return []
        bad = []
        for table in self.tables:
            for life in (0, 1):
                rngs = self.ranges(table, life, tables)
                live = [r for r in rngs if r.live]
                if life == table.live_life and len(live) != 1:
                    bad.append(f"{table.full} (life {life}): live ranges {live}")
                if life != table.live_life and live:
                    bad.append(f"{table.full} (life {life}, gone): still live in {live}")
        names = {t.full for t in self.tables}
        bad += [f"range of an unknown table: {r}" for r in tables.ranges if r.name not in names]
        return bad
