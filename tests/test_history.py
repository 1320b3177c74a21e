"""The member's opt-in history file (paimon_group.history)."""

from __future__ import annotations

from pathlib import Path


def test_a_second_close_never_closes_a_reused_descriptor(tmp_path: Path) -> None:
    """Simulation seed 11491: a member stopped twice closed its history twice;
    between the two closes the process opened another file under the same
    descriptor number (the next member's history), which the second close
    closed: that member's next write failed with EBADF."""
    import os

    from paimon_group.history import HistoryRecorder

    first = HistoryRecorder(str(tmp_path / "a.jsonl"), member_id="a")
    first.close()
    second = HistoryRecorder(str(tmp_path / "b.jsonl"), member_id="b")  # may reuse the number
    first.close()
    first.record("acquire", shard=0)  # after close: nothing, and no error
    second.record("acquire", shard=1)
    second.close()
    assert (tmp_path / "b.jsonl").read_text().count("\n") == 1
    assert (tmp_path / "a.jsonl").read_text() == ""
    assert os.path.exists(tmp_path / "b.jsonl")
