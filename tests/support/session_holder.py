"""Holds one coordinator session and one ephemeral key, in a process of its own.

The conformance suite runs it to test real session expiry: it SIGKILLs or
SIGSTOPs this process and watches the key vanish from another coordinator.

    python -m tests.support.session_holder --url URL --session-timeout 2 --key K

Protocol on stdout, one flushed line per event:

``READY <create_version> <session_id>``
    connected, and the ephemeral key ``K`` is created (value: our pid).
``EXISTS``
    ``K`` already existed; the process exits with status 1.
``STATE <connected|suspended|lost>``
    every session state change, as the session's listener sees it.
``CREATE_AFTER_LOST <SessionLost|ok|ErrorClassName>``
    once LOST, the result of creating the ephemeral key ``K-after-lost``
    (it must fail with SessionLost: the old session cannot own keys). The
    process then closes the coordinator and exits with status 0.

SIGTERM or SIGINT closes the coordinator (deleting the key) and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

from coordinators import (
    ConnectOptions,
    CoordinatorError,
    SessionLost,
    SessionState,
    open_coordinator,
)


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def hold(url: str, session_timeout_s: float, key: str) -> int:
    coordinator = open_coordinator(url, ConnectOptions(session_timeout_s=session_timeout_s))
    stop = asyncio.Event()
    lost = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def on_state(state: SessionState) -> None:
        say(f"STATE {state.value}")
        if state is SessionState.LOST:
            lost.set()

    await coordinator.connect()
    try:
        coordinator.session.add_listener(on_state)
        entry = await coordinator.create(key, str(os.getpid()).encode(), ephemeral=True)
        if entry is None:
            say("EXISTS")
            return 1
        say(f"READY {entry.create_version} {coordinator.session.id}")
        stopped = asyncio.create_task(stop.wait())
        lost_task = asyncio.create_task(lost.wait())
        await asyncio.wait({stopped, lost_task}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        lost_task.cancel()
        if lost.is_set():
            try:
                await coordinator.create(key + "-after-lost", b"", ephemeral=True)
                outcome = "ok"
            except SessionLost:
                outcome = "SessionLost"
            except CoordinatorError as err:
                outcome = type(err).__name__
            say(f"CREATE_AFTER_LOST {outcome}")
        return 0
    finally:
        await coordinator.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", required=True)
    parser.add_argument("--session-timeout", type=float, required=True)
    parser.add_argument("--key", required=True)
    args = parser.parse_args(argv)
    return asyncio.run(hold(args.url, args.session_timeout, args.key))


if __name__ == "__main__":
    sys.exit(main())
