"""Running one member as a process: signals, graceful handoff, exit codes.

SIGTERM or SIGINT starts a graceful leave (finish or abandon the batch in
flight, commit, release, close) bounded by ``shutdown_timeout_s``; the process
then exits 0. A fatal error (a handler that kept failing, a lost group) makes
:func:`run_until_signalled` raise it, after the shards were released.

This is the one signal runner: the CLI's ``run`` (:func:`run_until_signalled`)
and the library's :func:`run_member` both run a member through
:func:`run_member_async`.

Example::

    run_until_signalled(MemberConfig(group="g", warehouse="/wh", table="db.t"), print)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

from coordinators.errors import PaimonGroupError
from paimon_group.config.member import MemberConfig
from paimon_group.member import GroupMember, Handler, RebalanceListener
from paimon_group.member.signals import StopSignals
from paimon_group.reading.table import ShardedTable
from paimon_group.store.object_store import store_failure

log = logging.getLogger("paimon_group.runner")


async def run_member_async(
    config: MemberConfig, handler: Handler, *, metrics_port: int | None = None,
    progress_interval_s: float | None = None, listener: RebalanceListener | None = None,
    stop_signals: Iterable[int] = (), table: ShardedTable | None = None,
) -> None:
    """Run one member until a signal (``stop_signals``, by default SIGTERM and
    SIGINT); ``progress_interval_s``: log a progress line that often
    (:mod:`paimon_group.process.progress`; None or 0: never); ``table``: the config's
    table, already opened (:class:`GroupMember`)."""
    try:
        await _run_member(config, handler, metrics_port=metrics_port,
                          progress_interval_s=progress_interval_s, listener=listener,
                          stop_signals=stop_signals, table=table)
    except Exception as err:
        # A store that stops answering in the middle of a run: one line naming
        # it (as at the start), not pyarrow's error with a traceback.
        failure = None if isinstance(err, PaimonGroupError) else store_failure(
            err, config.table, config.warehouse, config.catalog_options or {})
        if failure is not None:
            raise failure from err
        raise


async def _run_member(
    config: MemberConfig, handler: Handler, *, metrics_port: int | None,
    progress_interval_s: float | None, listener: RebalanceListener | None,
    stop_signals: Iterable[int], table: ShardedTable | None,
) -> None:
    member = GroupMember(config, listener=listener, table=table, handle_signals=False)
    progress: asyncio.Task[None] | None = None
    server: Any = None
    if metrics_port is not None:
        from paimon_group.ops.metrics import serve_metrics

        server = serve_metrics(member, metrics_port)
    stop = asyncio.Event()
    # The process is the member's: its signals are taken whatever they were.
    signals = StopSignals(asyncio.get_running_loop(), lambda _sig: stop.set(), stop_signals,
                          only_defaults=False)
    signals.install()
    try:
        await member.start()
        if progress_interval_s:
            from paimon_group.process.progress import report_progress

            progress = asyncio.create_task(report_progress(member, progress_interval_s),
                                           name="pg-progress")
        runner = asyncio.create_task(member.run(handler), name="pg-run")
        stopper = asyncio.create_task(stop.wait(), name="pg-signal")
        await asyncio.wait([runner, stopper], return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            log.info("stop signal: handing shards off", extra={"group": config.group,
                                                               "member": config.member_id})
        await member.stop()
        stopper.cancel()
        if not runner.done():
            runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        member.raise_if_failed()
    finally:
        if progress is not None:
            progress.cancel()
        close = getattr(handler, "close", None)
        if callable(close):
            with contextlib.suppress(Exception):
                close()
        if member.state.value not in ("stopped", "failed", "created"):
            with contextlib.suppress(Exception):
                await member.stop(timeout=1.0)
        if server is not None:
            server.close()
        signals.restore()


def run_until_signalled(
    config: MemberConfig, handler: Handler, *, metrics_port: int | None = None,
    progress_interval_s: float | None = None, table: ShardedTable | None = None,
) -> None:
    asyncio.run(run_member_async(config, handler, metrics_port=metrics_port,
                                 progress_interval_s=progress_interval_s, table=table))


def run_member(config: MemberConfig, handler: Handler,
               listener: RebalanceListener | None = None,
               stop_signals: Iterable[int] = ()) -> None:
    """Synchronous wrapper: run a member with ``handler`` until a stop signal."""
    asyncio.run(run_member_async(config, handler, listener=listener, stop_signals=stop_signals))
