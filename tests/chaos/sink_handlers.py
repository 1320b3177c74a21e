"""A handler that writes each batch into a Paimon target through the sink, and
dies where a test tells it to (imported by real ``paimon-group run``).

``write`` (``--handler tests.chaos.sink_handlers:write``) writes the batch's
``id`` and ``v`` columns into the table ``$PG_SINK_TABLE`` of
``$PG_SINK_WAREHOUSE`` through one :class:`~paimon_group.sink.PaimonSink`
per process (``commit_interval_s`` = ``$PG_SINK_INTERVAL_S``, default 0.2).
It lets the sink's ``AlreadyWritten`` / ``StaleSinkWrite`` through, as a
handler should.

A test arms a kill with a file ``$PG_TEST_OUT/arm-<id>.json``::

    {"id": 7, "point": "written", "member": "m1" | null, "catch_up": false,
     "stall": false}

The first process of ``member`` (any member when null) to reach ``point``
takes the file (an atomic rename, so one process dies per arm), writes
``$PG_TEST_OUT/claimed-<id>.json`` (point, member, pid, and the batch: shard,
kind, first and next snapshot) and SIGKILLs itself. The points:

``files``
    the batch's data files are written into the target (nothing committed):
    a batch written whole once its files are, a member's batch (written in
    parts by one writer) once the member sealed it and its writer wrote them;
``commit``
    the target commit holding the batch (and the others queued with it) is
    made, in the sink's committer thread; no handler has returned yet;
``written``
    the batch is in the target (the commit of what the member sealed for it,
    once its handler returned, succeeded), and the member has not committed
    its position.

``catch_up``: only at a catch-up batch (one step over many source
snapshots). ``stall``: the armed member's handler first stalls once, in a
batch that is not a catch-up: it writes ``$PG_TEST_OUT/stalled-<id>`` and
waits for ``$PG_TEST_OUT/go-<id>`` (the test lets the source move on
meanwhile, so that the member's next step is a catch-up).
"""

from __future__ import annotations

import glob
import json
import os
import signal
import threading
import time
from typing import Any

from paimon_group.sink import PaimonSink

_lock = threading.Lock()
_sink: PaimonSink | None = None
_member: str | None = None
_stalled: set[int] = set()
_local = threading.local()


def write(batch: Any) -> None:
    global _member
    _member = batch.member_id
    sink = _the_sink()
    rows = batch.to_arrow().select(["id", "v"])
    _stall_if_told(batch)
    _local.batch = batch
    try:
        sink.write(rows, batch)
    finally:
        _local.batch = None


def _the_sink() -> PaimonSink:
    global _sink
    with _lock:
        if _sink is None:
            sink = PaimonSink(os.environ["PG_SINK_WAREHOUSE"], os.environ["PG_SINK_TABLE"],
                              commit_interval_s=float(os.environ.get("PG_SINK_INTERVAL_S",
                                                                     "0.2")))
            target = sink.target
            write_files, commit_once = target.write_files, target.commit_once
            open_writer = target.open_writer

            def files_then_die(*args: Any, **kwargs: Any) -> Any:
                messages = write_files(*args, **kwargs)
                _die_if_armed("files", getattr(_local, "batch", None))
                return messages

            def writer_dying_once_its_files_are_written(*args: Any, **kwargs: Any) -> Any:
                # A member's batch is written in parts by one writer, opened
                # in the handler's thread; its files are written when the
                # member seals the batch (PartsWriter.prepare), before the
                # target commit.
                writer = open_writer(*args, **kwargs)
                batch, prepare = getattr(_local, "batch", None), writer.prepare

                def prepare_then_die() -> Any:
                    messages = prepare()
                    _die_if_armed("files", batch)
                    return messages

                writer.prepare = prepare_then_die
                return writer

            def commit_then_die(*args: Any, **kwargs: Any) -> Any:
                done = commit_once(*args, **kwargs)
                if done:
                    _die_if_armed("commit", None)
                return done

            seal = sink.seal

            def seal_then_die_once_written(batch: Any) -> Any:
                future = seal(batch)
                future.add_done_callback(
                    lambda f: None if f.exception() is not None
                    else _die_if_armed("written", batch))
                return future

            target.write_files = files_then_die  # type: ignore[method-assign]
            target.open_writer = writer_dying_once_its_files_are_written  # type: ignore[method-assign]
            target.commit_once = commit_then_die  # type: ignore[method-assign]
            sink.seal = seal_then_die_once_written  # type: ignore[method-assign]
            _sink = sink
        return _sink


def _arms() -> list[dict[str, Any]]:
    found = []
    for path in glob.glob(os.path.join(os.environ["PG_TEST_OUT"], "arm-*.json")):
        try:
            with open(path) as f:
                found.append(json.load(f))
        except (FileNotFoundError, ValueError):
            pass  # taken meanwhile
    return found


def _is_catch_up(batch: Any) -> bool:
    return batch is not None and batch.kind.value == "catch-up"


def _stall_if_told(batch: Any) -> None:
    out = os.environ["PG_TEST_OUT"]
    for arm in _arms():
        if not arm.get("stall") or arm.get("member") != batch.member_id:
            continue
        with _lock:
            if arm["id"] in _stalled or _is_catch_up(batch):
                continue
            _stalled.add(arm["id"])
        with open(os.path.join(out, f"stalled-{arm['id']}"), "w"):
            pass
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(out, f"go-{arm['id']}")) \
                and time.monotonic() < deadline:
            time.sleep(0.05)


def _die_if_armed(point: str, batch: Any) -> None:
    for arm in _arms():
        if arm["point"] != point or arm.get("member") not in (None, _member):
            continue
        if arm.get("catch_up") and not _is_catch_up(batch):
            continue
        _take_and_die(arm, point, batch)


def _take_and_die(arm: dict[str, Any], point: str, batch: Any) -> None:
    out = os.environ["PG_TEST_OUT"]
    taken = os.path.join(out, f"taken-{arm['id']}")
    try:
        os.rename(os.path.join(out, f"arm-{arm['id']}.json"), taken)
    except FileNotFoundError:
        return  # another thread or process took it, or the test withdrew it
    claim = {"id": arm["id"], "point": point, "member": _member, "pid": os.getpid()}
    if batch is not None:
        claim.update(shard=batch.shard, kind=batch.kind.value, first=batch.first_snapshot,
                     next=batch.next_snapshot)
    path = os.path.join(out, f"claimed-{arm['id']}.json")
    with open(path + ".partial", "w") as f:
        json.dump(claim, f)
    os.replace(path + ".partial", path)
    os.kill(os.getpid(), signal.SIGKILL)
