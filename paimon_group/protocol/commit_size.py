"""How many shards one coordinator commit of a member may carry."""

from __future__ import annotations

from collections.abc import Iterable

SHARDS_PER_COMMIT = 32
"""The most shards a member's commit of positions or releases carries.

etcd refuses a transaction of more than ``--max-txn-ops`` compares or
operations (128 by default): a shard's commit is one compare and up to two
operations (its position, the deletion of its owner key). A member holding
more shards commits them in several commits, each fenced shard by shard;
no invariant needs the shards of one member in one commit (each shard's
check and write are in the same commit, which is what invariant 1 asks)."""


def commit_chunks(shards: Iterable[int], size: int = SHARDS_PER_COMMIT) -> list[list[int]]:
    """``shards`` in ascending order, cut into commits of at most ``size``
    (from 1 to :data:`SHARDS_PER_COMMIT`).

    >>> [len(c) for c in commit_chunks(range(70))]
    [32, 32, 6]
    >>> commit_chunks([5, 1, 3], size=2)
    [[1, 3], [5]]
    """
    if not 1 <= size <= SHARDS_PER_COMMIT:
        raise ValueError(f"shards per commit must be from 1 to {SHARDS_PER_COMMIT}, not {size}")
    ordered = sorted(shards)
    return [ordered[i:i + size] for i in range(0, len(ordered), size)]
