"""Planning a ``multi``: the znode operations of each create, put and delete,
and the implicit guards they rely on."""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Sequence

from coordinators.protocol import (
    Check,
    Delete,
    Op,
    Put,
)
from coordinators.zookeeper.layout import ASSUMED_KEY, KeyState, Layout, Txn, TxnOp


class Planner(Layout):
    """Turns checks and operations into one ``multi`` (see \"Commits\")."""

    def _create_ops(
        self, txn: Txn, key: str, state: KeyState, value: bytes, nonce: str, ephemeral: bool
    ) -> None:
        """Make ``key`` (absent or a plain directory) a key with ``value``."""
        znode, flag, epoch = self._znode(key), self._flag(key), self._epoch(key, nonce)
        marker = nonce.encode("ascii")
        if state.kind == "absent":
            txn.add(TxnOp("create", znode, key, False, value, ephemeral=ephemeral))
            txn.add(TxnOp("create", flag, key, False, marker, ephemeral=ephemeral))
            txn.add(TxnOp("create", epoch, key, False, ephemeral=ephemeral))
        elif ephemeral:
            # An ephemeral value znode: replace the (empty) directory znode.
            txn.add(TxnOp("create", flag, key, False, marker, ephemeral=True))
            txn.add(TxnOp("create", epoch, key, False, ephemeral=True))
            txn.add(TxnOp("delete", znode, key, False, version=state.data_version))
            txn.add(TxnOp("create", znode, key, False, value, ephemeral=True))
        else:
            txn.add(TxnOp("create", flag, key, False, marker))
            txn.add(TxnOp("create", epoch, key, False))
            txn.add(TxnOp("set", znode, key, False, value))

    def _delete_ops(self, txn: Txn, key: str, state: KeyState) -> KeyState:
        """Delete key ``key`` (state ``key``); the state it leaves."""
        txn.add(TxnOp("delete", self._epoch(key, state.nonce), key, False))
        txn.add(TxnOp("delete", self._flag(key), key, False))
        if state.children:
            # Keys below it keep its znode: leave it as a plain directory.
            txn.add(TxnOp("set", self._znode(key), key, False))
            return KeyState("dir", children=state.children)
        txn.add(TxnOp("delete", self._znode(key), key, False))
        return KeyState("absent")

    def _absence_ops(self, txn: Txn, key: str, explicit: bool) -> None:
        """Fail the transaction if ``key`` exists (ZooKeeper has no 'check absent')."""
        flag = self._flag(key)
        txn.add(TxnOp("create", flag, key, explicit))
        txn.add(TxnOp("delete", flag, key, explicit))

    def _plan_reads(
        self, checks: Sequence[Check], ops: Sequence[Op], optimistic: bool
    ) -> builtins.list[str]:
        """The keys whose state a commit must read before it can be planned."""
        keys: builtins.list[str] = []
        for check in checks:
            if check.version is not None:
                keys.append(check.key)
            elif check.create_version is not None:
                if (check.key, check.create_version) not in self._epochs:
                    keys.append(check.key)
        for op in ops:
            if isinstance(op, Delete) or not optimistic:
                keys.append(op.key)
        return keys

    def _plan(
        self,
        checks: Sequence[Check],
        ops: Sequence[Op],
        states: dict[str, KeyState],
        optimistic: bool,
    ) -> Txn | None:
        """The ``multi`` of a commit, or None if a check fails already."""
        txn = Txn()
        for check in checks:
            key = check.key
            if check.absent:
                self._absence_ops(txn, key, explicit=True)
            elif check.create_version is not None:
                nonce = self._epochs.get((key, check.create_version))
                if nonce is None:
                    state = states[key]
                    if state.kind != "key" or state.create_version != check.create_version:
                        return None  # that incarnation is gone, and never comes back
                    nonce = state.nonce
                txn.add(TxnOp("check", self._epoch(key, nonce), key, True))
            else:
                state = states[key]
                if state.kind != "key" or state.mzxid != check.version:
                    return None  # written since (mzxid values are never reused)
                txn.add(TxnOp("check", self._epoch(key, state.nonce), key, True))
                txn.add(TxnOp("check", self._znode(key), key, True, version=state.data_version))
        current: dict[str, KeyState] = {}
        guarded: set[str] = set()
        for op in ops:
            key = op.key
            found = current.get(key) or states.get(key) or (ASSUMED_KEY if optimistic else None)
            assert found is not None, f"state of {key} not read"
            state = found
            if isinstance(op, Put):
                value = bytes(op.value)
                if state.kind == "key":
                    if not state.new:
                        # Still a key when the multi runs (maybe another
                        # incarnation: a put overwrites whatever is there).
                        txn.add(TxnOp("check", self._flag(key), key, False))
                    txn.add(TxnOp("set", self._znode(key), key, False, value))
                else:
                    nonce = uuid.uuid4().hex
                    self._create_ops(txn, key, state, value, nonce, ephemeral=False)
                    state = KeyState("key", nonce=nonce, children=state.children, new=True)
            elif state.kind == "key":
                state = self._delete_ops(txn, key, state)
                guarded.add(key)
            elif key not in guarded:
                # Deleting an absent key is a no-op, but only if it is still
                # absent when the other writes are applied.
                self._absence_ops(txn, key, explicit=False)
                guarded.add(key)
            current[key] = state
        return txn
