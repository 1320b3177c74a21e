"""What a member lets others on its host do to it, through real ``paimon-group``
processes (the console script, started in a directory of the test's own):

* the working directory is on ``sys.path`` only while the handler's module
  is imported: a file there named like a module imported later (``timeit.py``)
  is never run;
* a secret-looking ``--catalog-option`` given on the command line (where
  ``ps`` shows it) is warned about in one line, its value never printed;
* a ``--history`` path that is a symbolic link is refused in one line, before
  anything is joined or created, and a new history file is private (0600).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.group_procs import REPO
from tests.support.tables import make_pk_table, write_rows

SCRIPT = Path(sys.executable).parent / "paimon-group"
TIMEOUT_S = 120.0


@pytest.fixture
def warehouse(tmp_path: Path) -> Path:
    wh = tmp_path / "wh"
    make_pk_table(str(wh), "db.t", buckets=1)
    write_rows(str(wh), "db.t", range(5))
    return wh


def paimon_group(cwd: Path, *args: str, out: Path | None = None
                 ) -> subprocess.CompletedProcess[str]:
    """The console script in ``cwd``; the package (and ``tests``) from this
    checkout through PYTHONPATH, which puts the checkout, not ``cwd``, on the path."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if out is not None:
        env["PG_TEST_OUT"] = str(out)
    return subprocess.run([str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S)


def run_args(wh: Path, *extra: str, handler: str = "tests.support.handlers:record"
             ) -> list[str]:
    return ["run", "--group", "g", "--warehouse", str(wh), "--table", "db.t",
            "--handler", handler, "--member-id", "m", "--max-handler-attempts", "1",
            "--session-timeout-s", "3", *extra]


HANDLER = '''
import json
import os
import stat
import sys

import host_safety_helper  # a sibling, imported with the handler: found


def handle(batch):
    import timeit  # first imported after the handler was loaded
    with open(os.path.join(os.environ["PG_TEST_OUT"], "seen.json"), "w") as f:
        json.dump({"cwd_on_path": os.getcwd() in sys.path, "timeit": timeit.__file__,
                   "helper": host_safety_helper.NAME}, f)
    raise RuntimeError("seen: stop here")
'''

PLANTED = '''
import os
import stat
open(os.path.join(os.environ["PG_TEST_OUT"], "planted-ran"), "w").close()
'''


def test_a_file_in_the_working_directory_never_shadows_a_later_import(
        tmp_path: Path, warehouse: Path) -> None:
    """Issue 44: with the working directory left first on ``sys.path``, a
    ``./timeit.py`` was run by the first ``import timeit`` after the handler was
    loaded. The handler's own module, and what it imports when it is imported,
    are still found there."""
    cwd = tmp_path / "cwd"
    out = tmp_path / "out"
    cwd.mkdir()
    out.mkdir()
    (cwd / "host_safety_handler.py").write_text(HANDLER)
    (cwd / "host_safety_helper.py").write_text("NAME = 'helper'\n")
    (cwd / "timeit.py").write_text(PLANTED)
    result = paimon_group(cwd, *run_args(warehouse, handler="host_safety_handler:handle"),
                          out=out)
    assert result.returncode == 3, result.stderr  # the handler's own stop
    assert not (out / "planted-ran").exists(), "./timeit.py was run"
    seen = json.loads((out / "seen.json").read_text())
    assert seen["helper"] == "helper"
    assert seen["cwd_on_path"] is False, seen
    assert not seen["timeit"].startswith(str(cwd)), seen


def test_the_path_is_restored_after_a_handler_import_and_its_package_still_imports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the process itself: after a handler import, failed or not, ``sys.path``
    is what it was; a handler package's submodule imported lazily, after
    loading, is still found (the package keeps its own directory)."""
    from paimon_group.errors import HandlerImportError
    from paimon_group.process.handlers import load_callable

    pkg = tmp_path / "host_safety_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "def handle(batch):\n"
        "    from host_safety_pkg import later\n"
        "    return later.VALUE\n")
    (pkg / "later.py").write_text("VALUE = 'later'\n")
    (tmp_path / "host_safety_broken.py").write_text("import no_such_module_of_host_safety\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    before = list(sys.path)
    try:
        handle = load_callable("host_safety_pkg:handle")
        assert sys.path == before
        assert handle(None) == "later"
        with pytest.raises(HandlerImportError, match="no_such_module_of_host_safety"):
            load_callable("host_safety_broken:handle")
        assert sys.path == before
    finally:
        for name in ("host_safety_pkg", "host_safety_pkg.later", "host_safety_broken"):
            sys.modules.pop(name, None)


SECRET = "SE/KRET-host-safety"


def test_a_secret_catalog_option_on_the_command_line_is_warned_about_once(
        tmp_path: Path, warehouse: Path) -> None:
    """Issue 44: ``--catalog-option s3.secret-key=...`` put the secret where
    ``ps`` shows it, without a word. One warning line now names the keys (never
    a value) and the two ways that keep them off the command line; nothing is
    said of them in the environment or a --config file, nor of an option that
    is not secret-looking."""
    args = run_args(warehouse, "--start", "yesterday")  # ends before joining: exit 2
    given = ["--catalog-option", f"s3.access-key=AK{SECRET}",
             "--catalog-option", f"s3.secret-key={SECRET}",
             "--catalog-option", "s3.endpoint=http://127.0.0.1:9"]
    result = paimon_group(tmp_path, *args, *given)
    assert result.returncode == 2, result.stderr
    assert SECRET not in result.stderr + result.stdout
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: --catalog-option s3.access-key, s3.secret-key on the command line can be "
        "read by other users of this host (ps): give secret catalog options in the --config "
        "file's [catalog-option] table or in PAIMON_GROUP_CATALOG_OPTION"], result.stderr
    config = tmp_path / "config.toml"
    config.write_text(f'[catalog-option]\n"s3.secret-key" = "{SECRET}"\n')
    quiet = [
        paimon_group(tmp_path, *args, "--catalog-option", "s3.endpoint=http://127.0.0.1:9"),
        paimon_group(tmp_path, *args, "--config", str(config)),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "PAIMON_GROUP_CATALOG_OPTION": f"s3.secret-key={SECRET}"}
    quiet.append(subprocess.run([str(SCRIPT), *args], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=TIMEOUT_S))
    for other in quiet:
        assert other.returncode == 2, other.stderr
        assert "warning:" not in other.stderr and SECRET not in other.stderr, other.stderr


def test_a_history_path_that_is_a_symbolic_link_is_refused_and_a_new_one_is_private(
        tmp_path: Path, warehouse: Path) -> None:
    """Issue 44: the history was opened following a symbolic link (mode 0644):
    in a shared folder, a link planted at the ``--history`` path made the
    member append to, or create, a file of the link's choosing. A link is
    refused in one line before anything is joined or created; a new history
    file is readable by its owner only."""
    shared = tmp_path / "shared"
    shared.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    (shared / "existing.jsonl").symlink_to(victim)
    (shared / "dangling.jsonl").symlink_to(tmp_path / "created-by-the-member.jsonl")
    for link in ("existing.jsonl", "dangling.jsonl"):
        result = paimon_group(tmp_path, *run_args(warehouse, "--history", str(shared / link),
                                                  handler="json:dumps"))
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2 and lines == [
            f"error: --history {shared / link} is a symbolic link: refused (it could send "
            "the history anywhere); give the path of the file itself"], result.stderr
    assert victim.read_text() == "keep\n"
    assert not (tmp_path / "created-by-the-member.jsonl").exists()
    assert not (warehouse / ".paimon-group").exists()  # nothing joined
    history = shared / "history.jsonl"
    result = paimon_group(tmp_path, *run_args(warehouse, "--history", str(history),
                                              handler="json:dumps"))
    assert result.returncode == 3, result.stderr  # json.dumps(batch) raised
    assert "acquire" in history.read_text()
    assert stat.S_IMODE(history.stat().st_mode) == 0o600
