"""The member's opt-in history file (paimon_group.member.history)."""

from __future__ import annotations

from pathlib import Path


def test_a_second_close_never_closes_a_reused_descriptor(tmp_path: Path) -> None:
    """Simulation seed 11491: a member stopped twice closed its history twice;
    between the two closes the process opened another file under the same
    descriptor number (the next member's history), which the second close
    closed: that member's next write failed with EBADF."""
    import os

    from paimon_group.member.history import HistoryRecorder

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


def test_two_stops_at_once_leave_and_close_once(tmp_path: Path) -> None:
    """Simulation seed 11491: a second stop() while the first was under way
    left and closed again. It waits for the first now; the history has one
    release per shard, and both calls return with the member stopped."""
    import asyncio
    import json

    from paimon_group import GroupMember, MemberConfig
    from paimon_group.member import MemberState
    from tests.support.tables import make_pk_table

    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=2)
    history = tmp_path / "h.jsonl"

    async def main() -> GroupMember:
        member = GroupMember(MemberConfig(group="g", warehouse=wh, table="db.t",
                                          coordinator=f"sqlite://{tmp_path}/c.sqlite",
                                          member_id="m", history_path=str(history),
                                          session_timeout_s=5))
        await member.start()
        for _ in range(200):
            if len(member.owned_shards) == 2:
                break
            await asyncio.sleep(0.05)
        await asyncio.gather(member.stop(), member.stop())
        return member

    member = asyncio.run(main())
    assert member.state is MemberState.STOPPED and member.error is None
    events = [json.loads(line)["event"] for line in history.read_text().splitlines()]
    assert events.count("acquire") == 2 and events.count("release") == 2, events


def test_a_stop_whose_caller_gave_up_can_be_called_again(tmp_path: Path) -> None:
    """A stop cancelled by its caller (a timeout around it) does not make the
    next stop() raise CancelledError: it stops."""
    import asyncio

    from paimon_group import GroupMember, MemberConfig
    from paimon_group.member import MemberState
    from tests.support.tables import make_pk_table

    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=2)

    async def main() -> GroupMember:
        member = GroupMember(MemberConfig(group="g", warehouse=wh, table="db.t",
                                          coordinator=f"sqlite://{tmp_path}/c.sqlite",
                                          member_id="m", session_timeout_s=5))
        await member.start()
        first = asyncio.ensure_future(member.stop())
        await asyncio.sleep(0)
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        await member.stop()
        return member

    import contextlib

    member = asyncio.run(main())
    assert member.state is MemberState.STOPPED


def test_a_history_that_is_a_symbolic_link_is_refused_and_a_new_one_is_private(
        tmp_path: Path) -> None:
    """Issue 44: the recorder itself opens with O_NOFOLLOW (a link planted after
    the command line's check, or a library member's history_path), and creates
    the file 0600."""
    import os
    import stat

    import pytest

    from paimon_group.errors import ConfigError
    from paimon_group.member.history import HistoryRecorder

    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    link = tmp_path / "h.jsonl"
    link.symlink_to(victim)
    with pytest.raises(ConfigError, match=r"h\.jsonl is a symbolic link: refused"):
        HistoryRecorder(str(link), member_id="m")
    assert victim.read_text() == "keep\n"
    rec = HistoryRecorder(str(tmp_path / "new.jsonl"), member_id="m")
    rec.close()
    assert stat.S_IMODE(os.stat(tmp_path / "new.jsonl").st_mode) == 0o600
