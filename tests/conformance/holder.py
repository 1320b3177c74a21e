"""Drives a ``tests.support.session_holder`` process from a test."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import BinaryIO

REPO_ROOT = Path(__file__).resolve().parents[2]


def _open_log(path: Path) -> BinaryIO:
    """The holder's stderr file (a local file: opening it does not block)."""
    return open(path, "wb")


class Holder:
    """A real process holding one session and one ephemeral key.

    Example (inside a test)::

        holder = await Holder.start(url, "members/h", 2.0, tmp_path / "h.log")
        create_version = int((await holder.expect("READY")).split()[1])
        holder.signal(signal.SIGKILL)
    """

    def __init__(self, process: asyncio.subprocess.Process, log_path: Path) -> None:
        self.process = process
        self.log_path = log_path
        self.lines: list[str] = []
        self._read = 0

    @classmethod
    async def start(cls, url: str, key: str, session_timeout_s: float, log_path: Path) -> Holder:
        with _open_log(log_path) as stderr:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.support.session_holder",
                "--url",
                url,
                "--session-timeout",
                str(session_timeout_s),
                "--key",
                key,
                cwd=REPO_ROOT,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        return cls(process, log_path)

    @property
    def pid(self) -> int:
        return self.process.pid

    def describe(self) -> str:
        errors = self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""
        return f"holder {self.pid}: stdout={self.lines!r}; stderr tail:\n{errors}"

    async def expect(self, prefix: str, timeout: float = 60.0) -> str:
        """The next unread line starting with ``prefix`` (earlier lines are skipped)."""
        assert self.process.stdout is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            while self._read < len(self.lines):
                line = self.lines[self._read]
                self._read += 1
                if line.startswith(prefix):
                    return line
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"no {prefix!r} line within {timeout}s; {self.describe()}")
            try:
                raw = await asyncio.wait_for(self.process.stdout.readline(), remaining)
            except TimeoutError:
                continue
            if not raw:
                await self.process.wait()
                raise AssertionError(
                    f"holder exited ({self.process.returncode}) before {prefix!r}; "
                    f"{self.describe()}"
                )
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    def signal(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    async def kill(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        await self.process.wait()
