"""docs/paimon-sink.md's pipeline, as written: its Python files (the targets,
the handlers, the marks cleared) and its local ``paimon-group run`` lines,
on a real warehouse with the embedded coordinator.

Each Python block whose first line is ``# NAME.py`` becomes that file, with
the page's warehouse ``/data/wh`` replaced by the test's. The source is the
README's ``shop.orders`` (``order_id`` primary key, ``amount``, 4 buckets);
the page's ``run`` lines without ``--coordinator`` start as written (the
warehouse replaced), three workers of two groups, while orders are added,
updated and deleted (``-D`` rows, as an engine writes a delete): the
primary-key target then holds every order's latest version once and no
deleted order, the append target every source change once with its kind.
Then ``clear_marks.py`` empties a group's marks. (The Spark handler's line runs in
tests/test_docs_commands.py.)
"""

from __future__ import annotations

import collections
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from paimon_group.sink import PaimonSink
from tests.support.group_procs import REPO
from tests.support.tables import _create, open_table

pytestmark = [pytest.mark.slow]

PAGE = REPO / "docs/paimon-sink.md"
SOURCE = pa.schema([pa.field("order_id", pa.int64(), nullable=False),
                    pa.field("amount", pa.float64())])


def page_files() -> dict[str, str]:
    """The page's Python files by name (indented blocks dedented)."""
    text = PAGE.read_text()
    out = {}
    for m in re.finditer(r"(?ms)^( *)```python\n(.*?)^\1```", text):
        body = textwrap.dedent(m.group(2))
        out[body.splitlines()[0].removeprefix("# ").split()[0].rstrip(":")] = body
    return out


def local_run_lines() -> list[list[str]]:
    """The page's ``paimon-group run ... --handler`` lines on the local coordinator."""
    text = PAGE.read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:2] == ["paimon-group", "run"] and "--handler" in words \
                    and "--coordinator" not in words:
                out.append(words)
    return out


def _commit(wh: Path, rows: list[tuple[int, float]], kind: str = "+I") -> None:
    """One source commit of ``rows``, each of row kind ``kind`` (the source
    has no row kind column: an engine writes a delete as a ``-D`` row so)."""
    from unittest import mock

    from pypaimon.table.row.row_kind import RowKind
    from pypaimon.write import row_kind

    table = open_table(wh, "shop.orders")
    builder = table.new_batch_write_builder()
    write, commit = builder.new_write(), builder.new_commit()
    value = RowKind.from_string(kind).value
    try:
        with mock.patch.object(row_kind, "row_kinds",
                               lambda options, data: [value] * data.num_rows):
            write.write_arrow(pa.table({"order_id": [r[0] for r in rows],
                                        "amount": [r[1] for r in rows]}, schema=SOURCE))
            commit.commit(write.prepare_commit())
    finally:
        write.close()
        commit.close()


def _read(wh: Path, name: str) -> pa.Table:
    builder = open_table(wh, name).new_read_builder()
    return builder.new_read().to_arrow(builder.new_scan().plan().splits())


def _tails(procs: list[tuple[subprocess.Popen[str], Path]], lines: int = 25) -> str:
    """Each worker's last log lines, as one string (pytest shortens a
    message that is not a string to a line)."""
    return "\n".join(f"--- {log.name}:\n" + "\n".join(log.read_text().splitlines()[-lines:])
                     for _, log in procs)


def _wait(check: Any, what: str, procs: list[tuple[subprocess.Popen[str], Path]],
          timeout: float = 180, held: Any = None) -> None:
    """Wait for ``check()``; on a timeout, say ``held()`` (what the target
    holds against what it should) and what each worker logged last."""
    deadline = time.monotonic() + timeout
    while not check():
        for proc, log in procs:
            assert proc.poll() is None, f"{log.name} exited:\n{_tails(procs, 60)}"
        if time.monotonic() >= deadline:
            pytest.fail(f"{what}: not done in {timeout:.0f} s; "
                        f"{held() if held is not None else ''}\n{_tails(procs)}")
        time.sleep(0.3)


def test_the_pipeline_of_the_page_writes_each_change_once(tmp_path: Path) -> None:
    files = page_files()
    assert {"make_targets.py", "enrich.py", "events.py", "enrich_spark.py",
            "clear_marks.py"} <= set(files), sorted(files)
    wh = tmp_path / "wh"
    for name, body in files.items():
        (tmp_path / name).write_text(body.replace("/data/wh", str(wh)))
    _create(wh, "shop.orders", SOURCE, primary_keys=["order_id"], options={"bucket": "4"})
    written = [(i, i * 1.5) for i in range(100)]
    _commit(wh, written)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO}"}
    subprocess.run([sys.executable, "make_targets.py"], cwd=tmp_path, env=env, check=True,
                   timeout=120)

    lines = local_run_lines()
    assert len(lines) == 3, lines
    procs = []
    for k, words in enumerate(lines):
        args = [str(wh) if w == "/data/wh" else w for w in words[1:]]
        log = tmp_path / f"worker-{k}.log"
        proc = subprocess.Popen([sys.executable, "-m", "paimon_group", *args], cwd=tmp_path,
                                env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                text=True)
        procs.append((proc, log))
    try:
        _wait(lambda: _read(wh, "shop.order_events").num_rows == 100, "the full scan", procs)
        more = [(i, i * 1.5) for i in range(100, 200)]
        updates = [(i, i * 3.0) for i in range(50)]
        for rows in (more[:50], more[50:], updates):
            _commit(wh, rows)
            time.sleep(0.5)
        written += more + updates
        latest = dict(written)
        # Deletes of orders from the full scan, updated ones and added ones.
        deleted = [(i, latest[i]) for i in (*range(40, 60), *range(150, 160))]
        _commit(wh, deleted, "-D")
        for i, _ in deleted:
            del latest[i]

        def amounts() -> dict[int, float]:
            out = _read(wh, "shop.orders_enriched")
            return dict(zip(out.column("order_id").to_pylist(), out.column("amount").to_pylist(),
                            strict=True))

        def enriched_held() -> str:
            out = _read(wh, "shop.orders_enriched")
            got = amounts()
            wrong = sorted(k for k in got if k in latest and got[k] != latest[k])
            missing = sorted(set(latest) - set(got))
            snapshots = collections.Counter(out.column("pg_source_snapshot").to_pylist())
            with PaimonSink(str(wh), "shop.orders_enriched") as target:
                marks = target.marks("enrich")
            return (f"{len(got)} orders held of {len(latest)}; missing {missing[:20]} "
                    f"({len(missing)}); stale amounts {wrong[:20]} ({len(wrong)}); rows by "
                    f"source snapshot {sorted(snapshots.items())}; marks {marks}")

        _wait(lambda: amounts() == latest, "the primary-key target", procs,
              held=enriched_held)
        _wait(lambda: _read(wh, "shop.order_events").num_rows >= len(written) + len(deleted),
              "the append target", procs)
        time.sleep(2.0)  # nothing more comes
        enriched = _read(wh, "shop.orders_enriched")
        assert enriched.num_rows == 200 - len(deleted)
        assert not {i for i, _ in deleted} & set(enriched.column("order_id").to_pylist())
        assert set(enriched.column("pg_row_kind").to_pylist()) == {"+I"}
        assert all(abs(e - a * 0.92) < 1e-9 for a, e in zip(
            enriched.column("amount").to_pylist(), enriched.column("amount_eur").to_pylist(),
            strict=True))
        assert min(enriched.column("pg_source_snapshot").to_pylist()) >= 1
        events = _read(wh, "shop.order_events")
        assert collections.Counter(zip(events.column("order_id").to_pylist(),
                                       events.column("amount").to_pylist(),
                                       events.column("_row_kind").to_pylist(), strict=True)) \
            == collections.Counter([(i, a, "+I") for i, a in written]
                                   + [(i, a, "-D") for i, a in deleted])
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=90) for proc, _ in procs]
    assert codes == [0, 0, 0], [log.read_text()[-2000:] for _, log in procs]

    with PaimonSink(str(wh), "shop.orders_enriched") as sink:
        assert set(sink.marks("enrich")) == {0, 1, 2, 3}
        subprocess.run([sys.executable, "clear_marks.py", str(wh), "shop.orders_enriched",
                        "enrich"], cwd=tmp_path, env=env, check=True, timeout=120)
        assert sink.marks("enrich") == {}
    with PaimonSink(str(wh), "shop.order_events") as events_sink:
        assert set(events_sink.marks("events")) == {0, 1, 2, 3}
