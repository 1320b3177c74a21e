"""Membership: join (check the table and the group record, register), rejoin, leave.

A member joins with a session of its own: it opens the coordinator, creates
or checks the group record (shard count, sharding rule, table identity),
registers its ephemeral member key (waiting out a crashed holder of its id),
and watches the group. When the session is lost, the supervisor drops every
shard and joins again with a new session. A graceful leave deletes the
member key first, so the leader rebalances while the batches in flight
finish, then releases every shard.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import socket
import uuid

import tenacity

from coordinators.errors import CoordinatorError, PaimonGroupError, SessionLost
from coordinators.protocol import Coordinator, SessionState
from coordinators.registry import open_coordinator
from paimon_group.config.warehouses import normalised_warehouse
from paimon_group.errors import MemberIdInUse, TableNotFound
from paimon_group.member.control import Control
from paimon_group.member.core import VERSION, JoinedSession, MemberCore
from paimon_group.member.head import HeadLoop, HeadRecord, TablePoller
from paimon_group.member.ownership import ShardOwnership
from paimon_group.member.state import MemberState
from paimon_group.member.table_refresh import (
    TablesPoller,
    make_member_table,
    open_tables,
    planned_map,
)
from paimon_group.member.tables import MemberTables, table_meta
from paimon_group.member.watches import ControlWatches
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.identity import check_table_identity, table_identity
from paimon_group.protocol.records import FEATURES, GroupMeta, MemberInfo
from paimon_group.protocol.sharding import Sharding, ShardRule, idle_shards_note, plan_new_group
from paimon_group.protocol.table_map import TableMap, TableRange
from paimon_group.reading.consumer_meta import ConsumerFilesOrigin, adopt_winner, prepare_new_group
from paimon_group.reading.discovery import TableListing, list_subscribed
from paimon_group.reading.mirror import ConsumerMirror
from paimon_group.reading.table import ShardedTable

log = logging.getLogger("paimon_group.member")


class Membership:
    """Joining, rejoining and leaving the group (see the module docstring).

    Its interface: :meth:`join`, :meth:`supervise` (the control loop, rejoining
    after a lost session), :meth:`leave`, :meth:`close_coordinator`; and
    :meth:`connect_coordinator`, the one step that opens a coordinator.
    """

    def __init__(self, core: MemberCore, ownership: ShardOwnership, control: Control) -> None:
        self._core = core
        self._ownership = ownership
        self._control = control

    async def connect_coordinator(self) -> Coordinator:
        """A new session's coordinator, connected, its session state listened
        to. Every join opens its coordinator here, so tests and benchmarks
        that inject faults into a member's coordinator, or count its
        requests, replace this one step."""
        config = self._core.config
        coord = open_coordinator(config.coordinator_url, config.connect_options())
        await coord.connect()
        coord.session.add_listener(self._on_session_state)
        return coord

    def _on_session_state(self, state: SessionState) -> None:
        # Called from the backend (on the loop thread); wake the loops up, and
        # tell the operator in one line when the coordinator stops answering.
        self._core.session_changed.set()
        self._core.wake.set()
        coord = self._core.coordinator
        deadline = coord.session.deadline if coord is not None else self._core.clock.monotonic()
        line = self._core.reachability.on_state(state.value, now=self._core.clock.monotonic(),
                                                 deadline=deadline)
        if line is not None and self._core.state in (MemberState.LEAVING, MemberState.STOPPED,
                                               MemberState.FAILED):
            # Our own close (a stop, or a failure, ends the session): nothing
            # to tell; "rejoins when the coordinator answers" would be wrong.
            log.debug("%s (while %s)", line, self._core.state.value)
        elif line is not None:
            level = logging.INFO if state is SessionState.CONNECTED else logging.WARNING
            self._core.log.log(level, line)

    async def join(self, *, first: bool) -> None:
        """Connect, create or check the group, register our member key."""
        coord = await self.connect_coordinator()
        group = GroupClient(coord, self._core.group_name)
        try:
            if self._core.config.single_table:
                meta = await self._ensure_meta(group, first=first)
            else:
                meta = await self._ensure_tables_meta(group)
            tables = await self._tables_for(meta)
            known = self._core.session
            if known is not None:
                self._core.replace_session(dataclasses.replace(known, meta=meta, tables=tables))
            self._core.forget_start()
            info = MemberInfo(
                member_id=self._core.member_id,
                host=socket.gethostname(),
                pid=os.getpid(),
                version=VERSION,
                started_at=self._core.clock.wall(),
                session=coord.session.id,
                features=tuple(sorted(FEATURES)),
            )
            await self._register(group, info)
        except BaseException:
            # Our own close of a session that never joined: not "session lost".
            coord.session.remove_listener(self._on_session_state)
            with contextlib.suppress(Exception):
                await coord.close()
            raise
        self._core.replace_session(JoinedSession(
            meta=meta, tables=tables, coordinator=coord, group=group,
            watches=ControlWatches.of_group(coord, group.keys)))
        self._control.forget_leadership()
        self._core.set_state(MemberState.RUNNING)
        self._core.joined.set()
        self._core.wake.set()

    async def _tables_for(self, meta: GroupMeta) -> MemberTables:
        """The tables of the session joined: the member's first (made at its
        first join, kept by every rejoin), following ``meta``; a group of
        several tables opens the tables its map added since."""
        known = self._core.session
        if meta.tables is not None:
            return await open_tables(self._core, meta, known.tables if known else None)
        tables = known.tables if known is not None else self._single_table(meta)
        tables.rebind(meta)
        return tables

    async def _ensure_tables_meta(self, group: GroupClient) -> GroupMeta:
        """The record of a group of several tables; a new group's map has the
        tables listed now, each in its range (member/table_refresh.py), their
        consumer files vetted as a new group of one table vets them."""
        config = self._core.config
        warehouse = normalised_warehouse(config.warehouse)
        subscription = str(config.subscription)
        existing = await self._created_or_claimed(group)
        if existing is not None:
            return await group.ensure_tables_meta(
                subscription, existing.tables or TableMap(), warehouse=warehouse,
                assignor=config.assignor)
        try:
            return await self._create_tables_meta(group, subscription, warehouse)
        finally:
            with contextlib.suppress(CoordinatorError):
                await group.end_creation()

    async def _created_or_claimed(self, group: GroupClient) -> GroupMeta | None:
        """The group's record; None once this member claimed its creation.
        Members starting together into a new group wait for the one that
        claimed it, rather than each listing, opening and vetting every table
        (a claim dies with its session; past the register wait the member
        prepares the group itself, and the record's create decides)."""
        give_up_at = self._core.clock.monotonic() + self._core.timing.register_wait_s
        while True:
            existing = await group.read_meta()
            if existing is not None:
                return existing
            if await group.claim_creation():
                # The claimer before us may have written the record and ended
                # its claim between our read and our claim: read it again.
                existing = await group.read_meta()
                if existing is not None:
                    await group.end_creation()
                return existing
            if self._core.clock.monotonic() > give_up_at:
                return None
            await asyncio.sleep(0.1)

    async def _create_tables_meta(self, group: GroupClient, subscription: str,
                                  warehouse: str) -> GroupMeta:
        """A new group of several tables' record, its tables listed and vetted."""
        core, config = self._core, self._core.config
        listing = await core.in_io(functools.partial(
            list_subscribed, core.catalog(), config.subscription, core.listing))
        # Every table's opening, then every table's vetting, in one call to
        # the planning thread each (not one a table: hundreds of hops).
        opened = await core.in_io(functools.partial(self._open_listed, listing))
        tables = planned_map(listing, opened)
        if not len(tables):
            raise TableNotFound(f"--table {subscription} matches no table that can be read "
                                f"in warehouse {warehouse}: create one first")
        incarnation = uuid.uuid4().hex

        def vet_all() -> None:
            for rng in tables.ranges:
                self._vet_files(opened[rng.name], ConsumerFilesOrigin(
                    core.group_name, incarnation, rng.shards, rng.sharding), rng.name)

        await core.in_io(vet_all)
        meta = await group.ensure_tables_meta(subscription, tables, incarnation=incarnation,
                                              warehouse=warehouse, assignor=config.assignor)
        if meta.incarnation != incarnation and meta.tables is not None:
            await core.in_io(functools.partial(self._adopt_winner, meta, opened, incarnation))
        return meta

    def _open_listed(self, listing: TableListing) -> dict[str, ShardedTable]:
        """The listed tables, opened (blocking); one gone since is left out."""
        opened = {}
        for listed in listing.tables:
            with contextlib.suppress(TableNotFound):
                opened[listed.name] = self._core.open_table(listed.name, listed.identity,
                                                            keep=True)
        return opened

    def _adopt_winner(self, meta: GroupMeta, opened: dict[str, ShardedTable],
                      incarnation: str) -> None:
        """Lost the race to create the group: each table's origin we stamped
        handed to the winner (:func:`adopt_winner`; blocking)."""
        assert meta.tables is not None
        for rng in meta.tables.live():
            table = opened.get(rng.name)
            if table is None:
                continue
            origin = ConsumerFilesOrigin(self._core.group_name, incarnation, rng.shards,
                                         rng.sharding)
            with contextlib.suppress(Exception):
                adopt_winner(table.table.file_io, table.table_path, origin,
                             table_meta(meta, rng))

    async def _vet_table_files(self, table: ShardedTable, origin: ConsumerFilesOrigin) -> None:
        """A new group's consumer files in ``table``'s directory, vetted
        (:func:`paimon_group.reading.consumer_meta.prepare_new_group`) for
        ``origin``."""
        await self._core.in_io(functools.partial(self._vet_files, table, origin))

    def _vet_files(self, table: ShardedTable, origin: ConsumerFilesOrigin,
                   what: str = "") -> None:
        """:meth:`_vet_table_files`, blocking; ``what`` names the table of a
        group of several."""
        mirror = ConsumerMirror(table.table.file_io, table.table_path, self._core.group_name,
                                clock=self._core.clock.monotonic)
        try:
            note = prepare_new_group(mirror, table.table.file_io, table.table_path, origin)
        except Exception as err:
            # Then the origin does not name this incarnation: no shard resumes
            # from a consumer file, each starts as configured.
            log.warning("group %s%s: consumer files not vetted (%s): shards without a "
                        "coordinator position start as configured", self._core.group_name,
                        f", table {what}" if what else "", err)
            return
        if note:
            log.warning("%s%s", f"table {what}: " if what else "", note)

    def _single_table(self, meta: GroupMeta) -> MemberTables:
        """The one table of a group of one table, its range every shard."""
        table = self._core.table
        assert table is not None
        rng = TableRange(name=table.identifier, table_id=meta.table_id, first=0,
                         shards=meta.num_shards, sharding=meta.sharding)
        return MemberTables([make_member_table(self._core, None, rng, meta, table)],
                            single=True)

    async def _ensure_meta(self, group: GroupClient, *, first: bool) -> GroupMeta:
        """The group's metadata; a new group gets the shard count and sharding
        rule of :func:`paimon_group.protocol.sharding.plan_new_group` (checked before
        anything is created)."""
        assert self._core.table is not None
        table = self._core.table
        # The identity of what is at the table's path now (read afresh, not
        # from the table loaded at start): a re-created table is refused here.
        table_id: str = await self._core.in_io(functools.partial(table_identity, table.table))
        warehouse = normalised_warehouse(self._core.config.warehouse)
        if not first:
            meta = await group.ensure_meta(None, table.identifier, table_id=table_id,
                                           warehouse=warehouse)
            return self._with_table_id(meta, table_id)
        existing = await group.read_meta()
        if existing is not None:
            # An existing group keeps its shard count and rule; an explicit
            # --shards that contradicts the count is refused by ensure_meta.
            meta = await group.ensure_meta(self._core.config.shards, table.identifier,
                                           table_id=table_id, warehouse=warehouse,
                                           assignor=self._core.config.assignor)
            if self._core.config.shards is None:
                log.info("group %s keeps its stored shard count %d (sharding %s)",
                         self._core.group_name, meta.num_shards, meta.sharding)
            return self._with_table_id(meta, table_id)
        shards, rule = plan_new_group(table, self._core.config.shards)
        origin = await self._vet_consumer_files(shards, rule.value)
        # Without --shards the planned count is a default only: if another
        # member created the group meanwhile, its stored count wins.
        meta = await group.ensure_meta(shards, table.identifier, sharding=rule.value,
                                       incarnation=origin.incarnation, table_id=table_id,
                                       warehouse=warehouse,
                                       explicit=self._core.config.shards is not None,
                                       assignor=self._core.config.assignor)
        if meta.num_shards != shards:
            log.info("group %s keeps its stored shard count %d (sharding %s): another member "
                     "created it meanwhile", self._core.group_name, meta.num_shards, meta.sharding)
        if meta.incarnation != origin.incarnation:
            with contextlib.suppress(Exception):  # then the winner's shards start as configured
                await self._core.in_io(functools.partial(
                    adopt_winner, table.table.file_io, table.table_path, origin, meta))
        await self._note_idle_shards(meta)
        return self._with_table_id(meta, table_id)

    async def _note_idle_shards(self, meta: GroupMeta) -> None:
        """Warn, once at creation, of shards the table's files do not reach yet."""
        assert self._core.table is not None
        table = self._core.table
        try:
            note = await self._core.in_io(lambda: idle_shards_note(
                table, Sharding(ShardRule.parse(meta.sharding), meta.num_shards)))
        except Exception as err:  # a hint only: never a reason not to start
            log.debug("shards with rows not counted: %s", err)
            note = None
        if note:
            log.warning("group %s: %s", self._core.group_name, note)

    def _with_table_id(self, meta: GroupMeta, table_id: str) -> GroupMeta:
        """A group created before table identities were stored is checked
        against the identity its member saw at its first join."""
        if not meta.table_id:
            known = self._core.meta.table_id if self._core.meta is not None else ""
            meta = dataclasses.replace(meta, table_id=known or table_id)
        check_table_identity(meta, self._core.group_name, table_id)
        if self._core.table is not None:
            self._core.table.expected_identity = meta.table_id
        return meta

    async def _vet_consumer_files(self, num_shards: int, sharding: str) -> ConsumerFilesOrigin:
        """A new group's origin (its new incarnation id), after its consumer
        files were vetted (:func:`paimon_group.reading.consumer_meta.prepare_new_group`)."""
        assert self._core.table is not None
        origin = ConsumerFilesOrigin(self._core.group_name, uuid.uuid4().hex, num_shards,
                                     sharding)
        await self._vet_table_files(self._core.table, origin)
        return origin

    async def _register(self, group: GroupClient, info: MemberInfo) -> None:
        """Register; if our id is held, wait for a dead holder's session to expire.

        A process that crashed leaves its member key until its session times
        out; a restart with the same id (static membership) waits that long.
        A key still held after that belongs to a *live* process: refuse.
        """
        deadline = self._core.clock.monotonic() + self._core.timing.register_wait_s
        while True:
            if await group.register(info) is not None:
                # Back after a goodbye: we are a member again, not leaving. A
                # removal record names an older session of this id: not ours.
                await group.forget_leaving(self._core.member_id)
                await group.forget_removed(self._core.member_id)
                return
            if self._core.clock.monotonic() > deadline:
                raise MemberIdInUse(
                    f"member id {self._core.member_id!r} is held by another live process in group "
                    f"{self._core.group_name!r}; stop it or choose another --member-id"
                )
            watch = group.coordinator.watch(group.keys.members_dir)
            try:
                await watch.wait(timeout=0.5)
            finally:
                await watch.close()

    async def supervise(self) -> None:
        """Runs the control loop; on a lost session rejoins with a new one."""
        while not self._core.stopping:
            control = asyncio.create_task(self._control.run(), name="pg-control")
            head_loop = self._new_head_loop()
            head = asyncio.create_task(self._run_head(head_loop), name="pg-head")
            self._core.set_tasks([control, head])
            try:
                try:
                    await control
                finally:
                    if head_loop is not None:
                        head_loop.stop()
                    head.cancel()
                    await asyncio.gather(head, return_exceptions=True)
            except SessionLost:
                if self._core.stopping:
                    return
                try:
                    await self._rejoin()
                except asyncio.CancelledError:
                    raise
                except BaseException as err:
                    # A rejoin that cannot succeed (the table re-created, an
                    # error that is not retriable, a coordinator down past the
                    # retries) fails the member; escaping here instead left it
                    # REJOINING for ever, with no error and no exit.
                    self._core.fail(err)
                    return
            except asyncio.CancelledError:
                raise
            except BaseException as err:
                self._core.fail(err)
                return

    def _new_head_loop(self) -> HeadLoop | None:
        """This session's part in one poll per group (member/head.py)."""
        coord, group, table = self._core.coordinator, self._core.group, self._core.table
        if coord is None or group is None:
            return None
        if not self._core.config.single_table:
            self._core.head.forget()
            tables_poller = TablesPoller(self._core)
            return HeadLoop(coord, group.keys, self._core.head,
                            poll_s=self._core.config.poll_interval_ms / 1000.0,
                            poll=lambda: asyncio.to_thread(tables_poller.poll),
                            leader_epoch=lambda: self._core.leader_epoch,
                            woken=self._core.head_woken.set)
        if table is None:
            return None
        self._core.head.forget()
        poller = TablePoller(latest=table.latest_snapshot_id, snapshot_text=table.snapshot_text,
                             identity=functools.partial(table_identity, table.table),
                             files=table.follow_up_files, clock=self._core.clock.monotonic)

        def learned(record: HeadRecord) -> None:
            # Only a text the leader read from the group's own table (as its
            # last check found it) is planned from.
            meta = self._core.meta
            if record.table_id and (meta is None or not meta.table_id
                                    or record.table_id == meta.table_id):
                table.remember_snapshot(record.latest, record.snapshot)
                if record.files:
                    table.handed_over.add(record.files)
            elif record.table_id is not None:
                table.forget_snapshots()  # gone or replaced: none of them is ours

        return HeadLoop(coord, group.keys, self._core.head,
                        poll_s=self._core.config.poll_interval_ms / 1000.0,
                        poll=lambda: asyncio.to_thread(poller.poll),
                        leader_epoch=lambda: self._core.leader_epoch,
                        woken=self._core.head_woken.set,
                        learned=learned)

    async def _run_head(self, loop: HeadLoop | None) -> None:
        """Run the head loop; a failure only makes the head go stale: members
        then poll the table themselves."""
        if loop is None:
            return
        try:
            await loop.run()
        except asyncio.CancelledError:
            raise
        except Exception as err:
            self._core.log.warning(
                "table head loop stopped (%s): members poll the table themselves", err)

    async def _rejoin(self) -> None:
        lost, epochs = self._ownership.lose_all()
        if lost:
            self._core.history.record("lost", shards=lost, epochs=epochs, reason="session lost")
            self._core.notify("on_lost", lost)
        self._core.set_state(MemberState.REJOINING)
        self._core.joined.clear()
        await self.close_coordinator()
        # Given up on the member's clock (tenacity's stop_after_delay would
        # read time.monotonic, not the clock the member's lease is judged on).
        clock = self._core.clock
        give_up_at = clock.monotonic() + self._core.timing.rejoin_give_up_s
        retry = tenacity.AsyncRetrying(
            # A new session lost before the join ended (expired while its
            # keys were created) needs only another new session: retried too.
            retry=tenacity.retry_if_exception(
                lambda e: isinstance(e, SessionLost)
                or (isinstance(e, PaimonGroupError) and e.retriable)
            ),
            wait=tenacity.wait_exponential(multiplier=0.2, max=5),
            stop=lambda _: clock.monotonic() >= give_up_at,
            reraise=True,
        )
        async for attempt in retry:
            with attempt:
                await self.join(first=False)

    async def close_coordinator(self) -> None:
        session = self._core.session
        if session is not None and session.watches is not None:
            await session.watches.close()
            session = self._core.session
            if session is not None:
                self._core.replace_session(dataclasses.replace(session, watches=None))
        coord = self._core.coordinator
        if coord is not None:
            with contextlib.suppress(Exception):
                await coord.close()
        session = self._core.session
        if session is not None:
            self._core.replace_session(session.closed())
        self._control.forget_leadership()

    async def leave(self) -> None:
        group = self._core.group
        if group is None:
            return
        # Leave the member list first so the leader rebalances at once, while
        # we finish the batches in flight.
        with contextlib.suppress(CoordinatorError):
            await group.deregister(self._core.member_id)
        # A control round may be acquiring still: the list of shards to
        # release is taken once it stopped, with what it acquired meanwhile.
        await self._ownership.stop_acquiring()
        await self._ownership.release_all()
        await self._control.resign(group)
