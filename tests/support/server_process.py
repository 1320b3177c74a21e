"""What the suite's server processes share: the child, its log, the signals.

:class:`~tests.support.etcd_server.EtcdServer` and
:class:`~tests.support.zk_server.ZkServer` start their own processes (their
commands, ports and readiness checks differ); what a test does to a running
server is the same for both and lives here: SIGKILL (a crash), SIGSTOP /
SIGCONT (a server that keeps its sockets but answers nothing), a clean stop,
and the tail of its log for a failure message.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from pathlib import Path
from typing import ClassVar


class ServerProcess:
    """A server the suite runs as a child process, logging to ``log_path``."""

    #: How the server is named in errors ("etcd", "ZooKeeper").
    server_name: ClassVar[str] = "the server"
    #: How long a clean stop may take before the process is killed.
    stop_wait_s: ClassVar[float] = 15.0
    #: Lines of the log a failure message shows.
    tail_lines: ClassVar[int] = 30

    process: subprocess.Popen[bytes] | None
    log_path: Path

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def log_tail(self, lines: int | None = None) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-(lines or self.tail_lines):])

    def _signal(self, sig: int) -> None:
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"{self.server_name} is not running")
        self.process.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: no clean shutdown; the data dir is left as a crash leaves it."""
        self._signal(signal.SIGKILL)
        assert self.process is not None
        self.process.wait(timeout=30)

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets but answers nothing."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        self._signal(signal.SIGCONT)

    def _stopping(self) -> None:
        """Called by :meth:`stop` first, running or not (bookkeeping of a subclass)."""

    def stop(self) -> None:
        """Terminate (resuming first if paused); a no-op when not running."""
        self._stopping()
        process = self.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGCONT)
            process.terminate()
        try:
            process.wait(timeout=self.stop_wait_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=self.stop_wait_s)
