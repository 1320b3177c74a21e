"""The README's "Your first pipeline", word for word, on a fresh virtualenv.

The section between ``<!-- first-pipeline:begin`` and ``first-pipeline:end -->``
is parsed: each Python block whose first line is ``# NAME.py`` becomes that
file, and the lines of the bash blocks run in order, in ``bash``, in a fresh
virtualenv with HOME set to a scratch directory (so ``~/first-pipeline`` is
there). Lines starting ``paimon-group run`` are the terminals of the workers:
they start in the background, and the lines after them run once each worker has
logged ``acquired shards`` and the first 100 orders are printed (a person waits
until they see both: a worker that starts second joins a group already reading).

The virtualenv: ``python -m venv .venv`` then ``.venv/bin/pip install .`` in a copy
of this checkout, as "Try it" says. Its dependencies
(pyarrow, pypaimon, ...) come from the test's own environment through a
``.pth`` file, so the install needs no download of them; the package itself,
its console script and the README's files are the fresh venv's own.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.group_procs import REPO

pytestmark = [pytest.mark.slow]

README = REPO / "README.md"
WAIT_S = 180


def section() -> str:
    text = README.read_text()
    start = text.index("<!-- first-pipeline:begin")
    return text[start:text.index("<!-- first-pipeline:end", start)]


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def rows_printed(out: str) -> int:
    return sum(int(n) for n in re.findall(r", (\d+) rows, amount", out))


def test_first_pipeline_word_for_word(tmp_path: Path) -> None:
    text = section()
    files = {b.splitlines()[0].removeprefix("# ").strip(): b for b in blocks(text, "python")}
    assert set(files) == {"make_table.py", "handler.py"}
    lines = [line for b in blocks(text, "bash") for line in b.splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[0] == "source .venv/bin/activate"

    home = tmp_path / "home"
    home.mkdir()
    subprocess.run([sys.executable, "-m", "venv", ".venv"], cwd=home, check=True)
    site = home / ".venv" / Path(sysconfig.get_path("purelib")).relative_to(sys.prefix)
    (site / "test-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    # "Try it": `.venv/bin/pip install .` in a clone (a copy of this checkout, so
    # that the build leaves nothing in it).
    clone = tmp_path / "clone"
    shutil.copytree(REPO, clone, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"))
    subprocess.run([str(home / ".venv/bin/pip"), "install", "-q", "."], cwd=clone,
                   check=True, timeout=600)
    assert (home / ".venv/bin/paimon-group").exists()

    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(HOME=str(home), PATH=os.defpath)
    workdir = home / "first-pipeline"

    def bash(line: str, **kw: object) -> subprocess.Popen[str]:
        script = f"source .venv/bin/activate && cd {workdir} && exec {line}"
        return subprocess.Popen(["bash", "-c", script], cwd=home, env=env, text=True,
                                **kw)  # type: ignore[call-overload]

    # The setup lines, then the files, then the rest.
    setup = subprocess.run(["bash", "-c", " && ".join(lines[:2])], cwd=home, env=env)
    assert setup.returncode == 0 and workdir.is_dir()
    for name, body in files.items():
        (workdir / name).write_text(body)

    workers: list[tuple[subprocess.Popen[str], Path]] = []
    waited = False
    describe_output = ""
    try:
        for line in lines[2:]:
            if line.startswith("paimon-group run"):
                out = tmp_path / f"worker-{len(workers)}.out"
                with open(out, "w") as f:
                    workers.append((bash(line, stdout=f, stderr=subprocess.STDOUT), out))
                continue
            if len(workers) == 2 and not waited:
                wait_for(lambda: sum(rows_printed(o.read_text()) for _, o in workers) >= 100
                         and all("acquired shards" in o.read_text() for _, o in workers),
                         workers)
                waited = True
            result = bash(line, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            output, _ = result.communicate(timeout=WAIT_S)
            assert result.returncode == 0, (line, output)
            if line.startswith("paimon-group describe"):
                describe_output = output
        wait_for(lambda: sum(rows_printed(o.read_text()) for _, o in workers) >= 200, workers)
    finally:
        for proc, _ in workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=60) for proc, _ in workers]
    outs = [o.read_text() for _, o in workers]
    assert codes == [0, 0], outs
    assert all(rows_printed(o) > 0 for o in outs), outs    # both workers got shards
    printed = [line for o in outs for line in o.splitlines() if "rows, amount" in line]
    assert all(LINE.fullmatch(line) for line in printed), printed   # whole lines only
    assert re.search(r"w[12] shard \d: initial snapshots 1\.\.1, \d+ rows", "".join(outs))
    assert re.search(r"w[12] shard \d: delta snapshots 2\.\.2, \d+ rows", "".join(outs))
    assert "group first" in describe_output and "w1" in describe_output


LINE = re.compile(r"w[12] shard \d: (initial|delta) snapshots \d+\.\.\d+, \d+ rows, "
                  r"amount \d+\.\d")

_CONCURRENT_CALLS = """
import sys, threading
from types import SimpleNamespace
import pyarrow as pa
sys.path.insert(0, sys.argv[1])
from handler import handle
table = pa.table({"order_id": [1, 2], "amount": [1.5, 3.0]})

def shard(k):
    for i in range(400):
        handle(SimpleNamespace(member_id="w1", shard=k, kind="delta", first_snapshot=i,
                               snapshot_id=i, to_arrow=lambda: table))

threads = [threading.Thread(target=shard, args=(k,)) for k in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
"""


def test_the_readme_handler_prints_whole_lines_from_several_shards(tmp_path: Path) -> None:
    """Batches of several shards are in the handler at once (threads): each
    line the README's handler prints must come out whole, as users copy it."""
    handler = next(b for b in blocks(section(), "python") if b.startswith("# handler.py"))
    (tmp_path / "handler.py").write_text(handler)
    out = subprocess.run([sys.executable, "-c", _CONCURRENT_CALLS, str(tmp_path)],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    lines = out.splitlines()
    assert len(lines) == 1600
    broken = [line for line in lines if not LINE.fullmatch(line)]
    assert not broken, broken[:5]


def wait_for(predicate: Callable[[], bool],
             workers: list[tuple[subprocess.Popen[str], Path]]) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if predicate():
            return
        for proc, out in workers:
            assert proc.poll() is None, out.read_text()
        time.sleep(0.3)
    raise AssertionError("timed out: " + " | ".join(o.read_text()[-2000:] for _, o in workers))
