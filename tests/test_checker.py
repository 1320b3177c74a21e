"""The history checker catches every planted violation, and passes clean histories.

Histories are built by hand (no processes): a clean baseline of two members
handing a shard over, then one fault planted per test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support import checker
from tests.support.checker import History, check_all

NUM_SHARDS = 2


def bucket_of(i: int) -> int:
    return i % NUM_SHARDS


class Builder:
    """Events and deliveries with increasing times."""

    def __init__(self) -> None:
        self.t = 100.0
        self.events: list[dict[str, Any]] = []
        self.deliveries: list[dict[str, Any]] = []

    def ev(self, event: str, member: str, pid: int | None = None, *, at: float | None = None,
           **fields: Any) -> dict[str, Any]:
        self.t = at if at is not None else self.t + 1.0
        e = {"t": self.t, "event": event, "member": member,
             "pid": pid if pid is not None else hash(member) % 10000, **fields}
        self.events.append(e)
        return e

    def batch(self, member: str, shard: int, epoch: int, snapshot: int, ids: list[int],
              *, outcome: str = "accepted", pid: int | None = None) -> None:
        self.deliveries.append({"t": self.t + 0.5, "member": member,
                                "pid": pid if pid is not None else hash(member) % 10000,
                                "shard": shard, "epoch": epoch,
                                "snapshot": snapshot, "next_snapshot": snapshot + 1,
                                "ids": ids})
        self.ev("deliver", member, pid, shard=shard, epoch=epoch, snapshot=snapshot,
                next_snapshot=snapshot + 1)
        self.ev("commit", member, pid, shard=shard, epoch=epoch, next_snapshot=snapshot + 1,
                outcome=outcome)

    def history(self) -> History:
        return History(deliveries=list(self.deliveries), events=list(self.events))


def clean() -> Builder:
    """a owns shards 0 and 1 and hands shard 1 over to b cleanly."""
    b = Builder()
    b.ev("acquire", "a", shard=0, epoch=1, next_snapshot=None)
    b.ev("acquire", "a", shard=1, epoch=1, next_snapshot=None)
    b.batch("a", 0, 1, 1, [0, 2])
    b.batch("a", 1, 1, 1, [1, 3])
    b.ev("release", "a", shard=1, epoch=1, ok=True, reason="reassigned", next_snapshot=2)
    b.ev("acquire", "b", shard=1, epoch=2, next_snapshot=2)
    b.batch("b", 1, 2, 2, [5])
    b.batch("a", 0, 1, 2, [4])
    return b


WRITTEN = {0, 1, 2, 3, 4, 5}


def only(violations: dict[str, list[str]]) -> set[str]:
    return {k for k, v in violations.items() if v}


def test_clean_history_passes() -> None:
    v = check_all(WRITTEN, clean().history(), bucket_of, NUM_SHARDS)
    assert v == {k: [] for k in v}
    assert checker.duplicates(clean().history()) == 0


def test_lost_row_is_caught() -> None:
    v = check_all(WRITTEN | {7}, clean().history(), bucket_of, NUM_SHARDS)
    assert only(v) == {"lost"}
    assert "[7]" in v["lost"][0]


def test_row_from_the_wrong_shard_is_caught() -> None:
    b = clean()
    b.batch("b", 1, 2, 3, [6])  # 6 is in bucket 0: shard 0's
    v = check_all(WRITTEN | {6}, b.history(), bucket_of, NUM_SHARDS)
    assert only(v) == {"wrong_shard"}


def test_position_moving_back_is_caught() -> None:
    b = clean()
    b.ev("commit", "a", shard=0, epoch=1, next_snapshot=1, outcome="accepted")
    assert only(check_all(WRITTEN, b.history(), bucket_of, NUM_SHARDS)) == {
        "positions_regressed"}


def test_release_committing_an_older_position_is_caught() -> None:
    b = clean()
    b.ev("release", "a", shard=0, epoch=1, ok=True, reason="leaving", next_snapshot=2)
    assert only(check_all(WRITTEN, b.history(), bucket_of, NUM_SHARDS)) == {
        "positions_regressed"}


def test_a_late_record_of_an_older_epoch_is_not_a_regression() -> None:
    # a's last commit (epoch 1, position 3) was accepted before b acquired
    # (epoch 2), but a was paused before recording it: its t comes late.
    b = Builder()
    b.ev("acquire", "a", shard=1, epoch=1)
    b.ev("deliver", "a", shard=1, epoch=1, snapshot=2, next_snapshot=3)
    b.ev("acquire", "b", shard=1, epoch=2, next_snapshot=3)
    b.ev("commit", "b", shard=1, epoch=2, next_snapshot=5, outcome="accepted")
    b.ev("commit", "a", shard=1, epoch=1, next_snapshot=3, outcome="accepted")
    v = check_all(set(), b.history(), bucket_of, NUM_SHARDS)
    assert v == {k: [] for k in v}


def test_epoch_reused_or_decreasing_is_caught() -> None:
    b = clean()
    b.ev("acquire", "c", shard=1, epoch=2)
    v = check_all(WRITTEN, b.history(), bucket_of, NUM_SHARDS)
    assert only(v) == {"epochs_not_increasing"}
    assert "acquired twice" in v["epochs_not_increasing"][0]

    b = clean()
    b.ev("acquire", "c", shard=0, epoch=0)
    v = check_all(WRITTEN, b.history(), bucket_of, NUM_SHARDS)
    assert only(v) == {"epochs_not_increasing"}


def test_a_late_record_of_a_lower_epoch_is_not_a_reversal() -> None:
    # c created the owner key (epoch 3) before d created its own (epoch 4),
    # but c's position read was held up and c recorded its acquisition after
    # d's: not a reversal. Created after d's acquisition: a reversal.
    b = clean()
    sent = b.t + 0.1
    b.ev("acquire", "d", shard=0, epoch=4, next_snapshot=2, sent=b.t + 0.5)
    b.ev("acquire", "c", shard=0, epoch=3, next_snapshot=2, sent=sent)
    v = check_all(WRITTEN, b.history(), bucket_of, NUM_SHARDS)
    assert "epochs_not_increasing" not in only(v)
    b.events[-1]["sent"] = b.events[-2]["t"] + 0.1
    v = check_all(WRITTEN, b.history(), bucket_of, NUM_SHARDS)
    assert "epochs_not_increasing" in only(v)


def test_a_process_adopting_its_own_key_again_is_not_an_epoch_reuse() -> None:
    # a's release of shard 1 raised (the key may still be there); a is
    # assigned the shard again and adopts its own key: the same epoch.
    b = Builder()
    b.ev("acquire", "a", shard=1, epoch=1, next_snapshot=None)
    b.batch("a", 1, 1, 1, [1])
    b.ev("release", "a", shard=1, epoch=1, ok=False, reason="reassigned", next_snapshot=2)
    b.ev("acquire", "a", shard=1, epoch=1, next_snapshot=2)
    b.batch("a", 1, 1, 2, [3])
    v = check_all({1, 3}, b.history(), bucket_of, NUM_SHARDS)
    assert v == {k: [] for k in v}
    # Another process acquiring that epoch is still caught.
    b.ev("acquire", "c", shard=1, epoch=1, next_snapshot=3)
    assert "epochs_not_increasing" in only(check_all({1, 3}, b.history(), bucket_of,
                                                     NUM_SHARDS))


def test_zombie_commit_accepted_after_takeover_is_caught() -> None:
    # a is paused mid-batch on shard 0; b takes shard 0 over (epoch 2); a
    # resumes and its commit of epoch 1 is ACCEPTED: the fencing failed.
    b = clean()
    b.ev("acquire", "b", shard=0, epoch=2, next_snapshot=3)
    b.batch("a", 0, 1, 3, [6])
    v = check_all(WRITTEN | {6}, b.history(), bucket_of, NUM_SHARDS)
    assert only(v) == {"stale_commit_accepted"}
    b.batch("b", 0, 2, 4, [8])  # and the new owner commits while a still thinks it owns
    v = check_all(WRITTEN | {6, 8}, b.history(), bucket_of, NUM_SHARDS)
    assert only(v) == {"stale_commit_accepted", "overlapping_committers"}


def test_zombie_commit_rejected_after_takeover_passes() -> None:
    b = clean()
    b.ev("acquire", "b", shard=0, epoch=2, next_snapshot=3)
    b.batch("a", 0, 1, 3, [6], outcome="rejected")
    b.ev("lost", "a", shards=[0], reason="stale epoch")
    b.batch("b", 0, 2, 3, [6])
    h = b.history()
    v = check_all(WRITTEN | {6}, h, bucket_of, NUM_SHARDS)
    assert v == {k: [] for k in v}
    assert checker.duplicates(h) == 1  # explained: the first batch was not committed
    assert checker.rejected_commits(h) == 1


def test_commit_accepted_after_own_release_is_caught() -> None:
    b = clean()
    b.batch("a", 1, 1, 2, [7])  # a released shard 1 earlier, nobody else committed since
    v = check_all(WRITTEN | {7}, b.history(), bucket_of, NUM_SHARDS)
    assert "commit_after_ownership_ended" in only(v)


def test_commit_accepted_after_session_loss_is_caught() -> None:
    b = Builder()
    b.ev("acquire", "a", shard=0, epoch=1)
    b.ev("lost", "a", shards=[0], reason="session lost")
    b.batch("a", 0, 1, 1, [0])
    v = check_all({0}, b.history(), bucket_of, NUM_SHARDS)
    assert only(v) == {"commit_after_ownership_ended"}


def test_loss_of_an_earlier_epoch_does_not_end_the_current_ownership() -> None:
    """A batch in flight when a's session was lost is rejected after a acquired
    the shard again: the loss recorded then names the old epoch, and a's
    commits under the new epoch are its own."""
    b = Builder()
    b.ev("acquire", "a", shard=0, epoch=1)
    b.ev("lost", "a", shards=[0], epochs=[1], reason="session lost")
    b.ev("acquire", "a", shard=0, epoch=5)
    b.ev("commit", "a", shard=0, epoch=1, next_snapshot=2, outcome="rejected")
    b.ev("lost", "a", shards=[0], epochs=[1], reason="stale epoch")
    b.batch("a", 0, 5, 1, [0])
    assert only(check_all({0}, b.history(), bucket_of, NUM_SHARDS)) == set()
    # A loss of the current epoch still ends it.
    b.ev("lost", "a", shards=[0], epochs=[5], reason="owner key gone")
    b.batch("a", 0, 5, 2, [2])
    v = check_all({0, 2}, b.history(), bucket_of, NUM_SHARDS)
    assert only(v) == {"commit_after_ownership_ended"}


def test_commit_with_an_epoch_never_acquired_is_caught() -> None:
    b = clean()
    b.batch("c", 0, 9, 3, [6])
    v = check_all(WRITTEN | {6}, b.history(), bucket_of, NUM_SHARDS)
    assert "commit_after_ownership_ended" in only(v)
    assert "never acquired" in v["commit_after_ownership_ended"][0]


def test_two_members_committing_over_overlapping_ownership_is_caught() -> None:
    # Both a and b believe they own shard 0, with the SAME epoch (a broken
    # coordinator), and both commits are accepted while both own it.
    b = Builder()
    b.ev("acquire", "a", shard=0, epoch=1)
    b.ev("acquire", "b", shard=0, epoch=1)
    b.batch("a", 0, 1, 1, [0])
    b.batch("b", 0, 1, 2, [2])
    v = check_all({0, 2}, b.history(), bucket_of, NUM_SHARDS)
    assert "overlapping_committers" in only(v)


def test_overlap_without_both_committing_passes() -> None:
    # a was SIGKILLed holding shard 0 (no release: its interval never ends);
    # b took over after the session expired and commits: no violation.
    b = Builder()
    b.ev("acquire", "a", shard=0, epoch=1)
    b.batch("a", 0, 1, 1, [0])
    b.ev("acquire", "b", shard=0, epoch=2, next_snapshot=2)
    b.batch("b", 0, 2, 2, [2])
    v = check_all({0, 2}, b.history(), bucket_of, NUM_SHARDS)
    assert v == {k: [] for k in v}


def test_duplicate_from_two_committed_batches_is_caught() -> None:
    b = clean()
    b.batch("b", 1, 2, 3, [5])  # row 5 again, and this batch's commit accepted too
    v = check_all(WRITTEN, b.history(), bucket_of, NUM_SHARDS)
    assert "unexplained_duplicates" in only(v)


def test_a_pin_commit_does_not_confirm_the_full_scan_read_after_it() -> None:
    # a pins its start (a full scan of snapshot 3 pending, next snapshot 4),
    # reads the full scan and loses its session before committing it; b reads
    # the same full scan again and commits. The pin's next snapshot equals the
    # full scan's, but it was accepted before the batch was read: the first
    # delivery was never committed, so the repeat is explained.
    b = Builder()
    b.ev("acquire", "a", shard=1, epoch=1, next_snapshot=None)
    b.ev("commit", "a", shard=1, epoch=1, next_snapshot=4, outcome="accepted")
    b.deliveries.append({"t": b.t + 0.5, "member": "a", "pid": hash("a") % 10000, "shard": 1,
                         "epoch": 1, "snapshot": 3, "next_snapshot": 4, "ids": [1, 3]})
    b.ev("deliver", "a", shard=1, epoch=1, snapshot=3, next_snapshot=4)
    b.ev("lost", "a", shards=[1], epochs=[1], reason="session lost")
    b.ev("commit", "a", shard=1, epoch=1, next_snapshot=4, outcome="rejected")
    b.ev("acquire", "b", shard=1, epoch=2, next_snapshot=4)
    b.batch("b", 1, 2, 3, [1, 3])
    v = check_all({1, 3}, b.history(), bucket_of, NUM_SHARDS)
    assert v == {k: [] for k in v}
    # The same two deliveries with a's commit accepted after its batch: caught.
    b.ev("commit", "a", shard=1, epoch=1, next_snapshot=4, outcome="accepted",
         at=b.deliveries[0]["t"] + 0.1)
    assert "unexplained_duplicates" in only(check_all({1, 3}, b.history(), bucket_of,
                                                      NUM_SHARDS))


def test_redelivery_after_a_failed_commit_attempt_is_explained() -> None:
    # The commit of the first delivery raised (coordinator unavailable: no
    # outcome recorded); the owner re-read the same snapshot and committed.
    b = clean()
    b.deliveries.append({"t": b.t + 0.5, "member": "b", "pid": hash("b") % 10000, "shard": 1,
                         "epoch": 2, "snapshot": 3, "next_snapshot": 4, "ids": [7]})
    b.ev("deliver", "b", shard=1, epoch=2, snapshot=3, next_snapshot=4)
    b.batch("b", 1, 2, 3, [7])
    h = b.history()
    v = check_all(WRITTEN | {7}, h, bucket_of, NUM_SHARDS)
    assert v == {k: [] for k in v}
    assert checker.duplicates(h) == 1


@pytest.mark.parametrize("behind", [False, True])
def test_a_replay_the_sink_refused_as_written_is_explained(behind: bool) -> None:
    # Seed 500088: b's batch of snapshot 3 is in the target, its position
    # commit failed; paced by the sink, b re-read from its position a
    # catch-up of snapshots 3 and 4 (next 5), which the sink refused
    # ("already holds up to 3"): b committed the mark (4), then the empty
    # step of snapshot 4 (5). The replay is no committed batch. Read from
    # behind a position b had committed (4), it is a position moved back.
    b = clean()
    pid = hash("b") % 10000
    b.deliveries.append({"t": b.t + 0.5, "member": "b", "pid": pid, "shard": 1, "epoch": 2,
                         "snapshot": 3, "next_snapshot": 4, "ids": [7]})
    b.ev("deliver", "b", shard=1, epoch=2, snapshot=3, next_snapshot=4)
    b.ev("commit", "b", shard=1, epoch=2, next_snapshot=4,
         outcome="accepted" if behind else "error")
    b.deliveries.append({"t": b.t + 0.5, "member": "b", "pid": pid, "shard": 1, "epoch": 2,
                         "snapshot": 4, "first": 3, "next_snapshot": 5, "ids": [7],
                         "already_written": True})
    b.ev("deliver", "b", shard=1, epoch=2, snapshot=4, next_snapshot=5)
    b.ev("commit", "b", shard=1, epoch=2, next_snapshot=4, outcome="accepted")
    b.ev("commit", "b", shard=1, epoch=2, next_snapshot=5, outcome="accepted")
    v = check_all(WRITTEN | {7}, b.history(), bucket_of, NUM_SHARDS)
    assert only(v) == ({"unexplained_duplicates"} if behind else set()), v
    # Not refused, the replay's rows count twice.
    del b.deliveries[-1]["already_written"]
    v = check_all(WRITTEN | {7}, b.history(), bucket_of, NUM_SHARDS)
    assert only(v) == {"unexplained_duplicates"}, v


def test_recovery_time_and_ownership_at_a_time() -> None:
    b = Builder()
    b.ev("acquire", "a", shard=0, epoch=1, at=10.0)
    b.ev("acquire", "a", shard=1, epoch=1, at=10.5)
    b.ev("acquire", "b", shard=0, epoch=2, at=13.0)
    b.ev("acquire", "b", shard=1, epoch=2, at=14.0)
    h = b.history()
    assert checker.owned_at(h, "a", 11.0) == {0, 1}
    assert checker.recovery_time(h, "a", 11.0) == pytest.approx(3.0)
    assert checker.recovery_time(h, "b", 11.0) is None


def test_load_skips_a_torn_last_line(tmp_path: Path) -> None:
    e = {"t": 1.0, "event": "acquire", "member": "a", "pid": 1, "shard": 0, "epoch": 1}
    (tmp_path / "history-a.jsonl").write_text(json.dumps(e) + "\n" + '{"t": 2.0, "ev')
    (tmp_path / "deliveries-1.jsonl").write_text("")
    h = History.load(tmp_path)
    assert [x["event"] for x in h.events] == ["acquire"]


@pytest.mark.parametrize(("ok", "flagged"), [(False, False), (True, True)])
def test_a_commit_after_an_unconfirmed_release_is_the_coordinator_s_call(
        ok: bool, flagged: bool) -> None:
    """A revoke that abandoned its in-flight batch and whose release was not
    confirmed (``ok`` false) leaves the owner key to the coordinator: the
    batch's later commit is accepted only while the key is still that
    epoch's, by design. After a confirmed release, a commit accepted at that
    epoch is a violation."""
    events = [
        {"event": "acquire", "member": "m3", "shard": 2, "epoch": 82, "t": 1.0},
        {"event": "release", "member": "m3", "shard": 2, "epoch": 82, "ok": ok,
         "reason": "reassigned", "t": 2.0},
        {"event": "deliver", "member": "m3", "shard": 2, "epoch": 82, "t": 2.5},
        {"event": "commit", "member": "m3", "shard": 2, "epoch": 82, "next_snapshot": 3,
         "outcome": "accepted", "t": 2.6},
    ]
    found = checker.commits_after_ownership_ended(History(events=events))
    assert bool(found) is flagged, found
