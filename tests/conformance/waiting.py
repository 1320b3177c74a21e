"""Watch helpers of the conformance tests (the polling ones: tests/support/waiting.py)."""

from __future__ import annotations

from coordinators import Coordinator, Watch

# How long a watch may take to report a change; only reached when one is missed.
WAKE_LIMIT_S = 30.0


async def drain(watch: Watch, quiet_s: float = 0.3, attempts: int = 20) -> None:
    """Consume pending (possibly spurious) wake-ups until the watch stays quiet."""
    for _ in range(attempts):
        if not await watch.wait(timeout=quiet_s):
            return
    raise AssertionError(f"watch still waking after {attempts} waits with nothing changing")


async def wait_until_listed(
    watch: Watch, coordinator: Coordinator, prefix: str, expected: list[str]
) -> None:
    """Wait on ``watch`` and re-read until ``prefix`` lists ``expected``.

    Every read follows a wake-up, so a wait that times out while the listing
    is still wrong means the watch missed a change.
    """
    while True:
        assert await watch.wait(timeout=WAKE_LIMIT_S), f"watch missed a change of {prefix}"
        if [e.key for e in await coordinator.list(prefix)] == expected:
            return
