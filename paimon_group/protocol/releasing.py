"""Owner keys a member must release but could not yet.

A revoke deletes the shard's owner key, guarded by its epoch. If that delete
cannot be made (the session was not confirmed live at that moment, or the
commit raised), the key stays bound to our session, which lives on: nobody
deletes it, and the shard's new assignee waits for ever. Two mechanisms close
that hole:

* **releasing**: the shard (with its epoch) is remembered here and the
  release is retried on every control round while our session is live, until
  the key is gone or is no longer ours. Reading the shard stopped at the
  revoke; only the key is left.
* **sweep**: on the ownership check, every owner key created by our session,
  or carrying our member id from an older session, that we do not own now and
  that is not assigned to us, is released. It catches keys no record points
  to (a process that lost its local state, a release dropped by a bug).

Every delete is ``Check.created_at(key, epoch) + Delete`` in one commit: a key
re-created by a new owner has another epoch and is never touched. When our
session is lost its ephemeral keys are gone with it: :meth:`PendingReleases.clear`.

Example (with a connected :class:`~paimon_group.protocol.group.GroupClient` ``group``)::

    pending = PendingReleases()
    pending.add(3, epoch=17)
    released = await pending.retry(group)          # [3] once the delete went through
    orphans = await pending.sweep(group, "m1", owned={0: 12}, assigned={0})
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Set

from coordinators.errors import CoordinatorError
from paimon_group.protocol.group import GroupClient
from paimon_group.protocol.group_views import OwnerView

log = logging.getLogger("paimon_group.member")


def is_ours(view: OwnerView, session: str, member_id: str) -> bool:
    """Whether an owner key is of our ``session``, or of our member id in an
    older session (a key a lost session of ours left behind)."""
    return view.session == session or view.member_id == member_id


class PendingReleases:
    """Shards whose owner key (at ``epoch``) is still to be deleted."""

    def __init__(self) -> None:
        self._pending: dict[int, int] = {}

    def __bool__(self) -> bool:
        return bool(self._pending)

    def __contains__(self, shard: object) -> bool:
        return shard in self._pending

    def add(self, shard: int, epoch: int) -> None:
        self._pending[shard] = epoch

    def discard(self, shard: int) -> None:
        """We own the shard again (a key of our own session was adopted)."""
        self._pending.pop(shard, None)

    def clear(self) -> None:
        """Our session is gone, and its ephemeral keys with it."""
        self._pending.clear()

    async def retry(self, group: GroupClient) -> list[int]:
        """Try every pending release once; the shards whose key is gone now
        (deleted, or no longer ours: absent or re-created by another owner).
        A release that raises stays pending for the next round."""
        done: list[int] = []
        for shard, epoch in sorted(self._pending.items()):
            try:
                await group.release(shard, epoch)  # False: not ours (any more) either
            except CoordinatorError as err:
                log.warning("shard %d: owner key (epoch %d) still not released: %s",
                            shard, epoch, err)
                continue
            if self._pending.get(shard) == epoch:
                del self._pending[shard]
            done.append(shard)
        return done

    async def sweep(
        self,
        group: GroupClient,
        member_id: str,
        *,
        owned: Mapping[int, int],
        assigned: Set[int],
        owners: Mapping[int, OwnerView] | None = None,
    ) -> list[int]:
        """Release owner keys of our session (or of our member id in an older
        session) that we neither own (``owned``: shard -> epoch) nor are
        assigned (an assigned one is adopted by the next acquisition instead);
        the shards released. ``owners``: a listing already made, if any."""
        session = group.coordinator.session.id
        listing = owners if owners is not None else await group.owners()
        for view in listing.values():
            if not is_ours(view, session, member_id) or owned.get(view.shard) == view.epoch \
                    or view.shard in assigned:
                continue
            if view.shard not in self._pending:
                log.warning("shard %d: owner key (epoch %d, member %s) is ours but not owned: "
                            "releasing it", view.shard, view.epoch, view.member_id,
                            extra={"shard": view.shard, "epoch": view.epoch})
            self.add(view.shard, view.epoch)
        return await self.retry(group) if self._pending else []
