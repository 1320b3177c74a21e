"""``paimon-group demo`` runs on the package alone and accounts for every row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_demo_delivers_every_row(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "paimon_group", "demo", "--seconds", "8", "--dir",
         str(tmp_path / "demo")],
        cwd=tmp_path, capture_output=True, text=True, timeout=400,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "every written row was delivered" in result.stdout
    assert "missing 0" in result.stdout
    assert "'worker-0': 0" in result.stdout
