"""docs/library.md, as written: its ``MemberConfig`` table is the dataclass's
(a field added without a row fails here; each flag named is one of
``paimon-group run``), and its complete worker (the block whose first line is
``# worker.py``, the page's warehouse ``/data/wh`` replaced by the test's)
runs as a real process on a real table with the embedded SQLite coordinator:
it reads every row, and SIGTERM ends it with a handoff and exit 0.
"""

from __future__ import annotations

import dataclasses
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pytest

import paimon_group
from paimon_group import MemberConfig
from tests.support.group_procs import REPO
from tests.support.tables import _create, open_table

PAGE = REPO / "docs/library.md"
ORDERS = pa.schema([pa.field("order_id", pa.int64(), nullable=False),
                    pa.field("amount", pa.float64())])
# Defaults made by a factory, as the page words them.
FACTORY_DEFAULTS = {"catalog_options": "`{}`", "max_parallel_shards": "one per CPU, at most 4"}


def _cells(line: str) -> list[str]:
    parts = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [p.strip().replace("\\|", "|") for p in parts]


def config_rows() -> dict[str, list[str]]:
    """The page's MemberConfig table: field name -> [type, default, flag, meaning]."""
    text = PAGE.read_text()
    table = text.split("<!-- member-config:begin -->")[1].split("<!-- member-config:end -->")[0]
    rows = [_cells(line) for line in table.strip().splitlines()[2:]]
    return {row[0].strip("`"): row[1:] for row in rows}


def _default(f: dataclasses.Field[object]) -> str:
    if f.default is dataclasses.MISSING:
        return FACTORY_DEFAULTS[f.name] if f.default_factory is not dataclasses.MISSING \
            else "required"
    if isinstance(f.default, str):
        return f'`"{f.default}"`'
    return f"`{f.default!r}`"


def test_the_page_has_a_row_for_every_member_config_field() -> None:
    rows = config_rows()
    fields = dataclasses.fields(MemberConfig)
    assert list(rows) == [f.name for f in fields]
    for f in fields:
        type_, default, _flag, meaning = rows[f.name]
        assert (type_, default) == (f"`{f.type}`", _default(f)), f.name
        assert meaning, f.name


def test_each_flag_of_the_table_is_an_option_of_run() -> None:
    from paimon_group.cli import run

    options = {opt for param in run.params for opt in param.opts}
    for name, (_type, _default, flags, _meaning) in config_rows().items():
        named = re.findall(r"`(--[a-z-]+)", flags)
        assert named or flags == "none", name
        assert set(named) <= options, (name, set(named) - options)


def test_dir_of_the_package_lists_its_public_names() -> None:
    assert set(paimon_group.__all__) <= set(dir(paimon_group))
    assert "GroupMember" in dir(paimon_group)


def page_worker() -> str:
    """The page's ``# worker.py`` block, word for word."""
    text = PAGE.read_text()
    blocks = [textwrap.dedent(m.group(2))
              for m in re.finditer(r"(?ms)^( *)```python\n(.*?)^\1```", text)]
    [worker] = [b for b in blocks if b.startswith("# worker.py\n")]
    return worker


def _commit(wh: Path, ids: range) -> None:
    table = open_table(wh, "shop.orders")
    builder = table.new_batch_write_builder()
    write, commit = builder.new_write(), builder.new_commit()
    try:
        write.write_arrow(pa.table({"order_id": list(ids), "amount": [i * 1.5 for i in ids]},
                                   schema=ORDERS))
        commit.commit(write.prepare_commit())
    finally:
        write.close()
        commit.close()


def _default_sigint() -> None:
    # As in a terminal: SIGINT not ignored (a shell's background jobs ignore it).
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_the_page_s_worker_reads_every_row_and_stops_on_sigterm(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    _create(wh, "shop.orders", ORDERS, primary_keys=["order_id"], options={"bucket": "4"})
    _commit(wh, range(100))
    (tmp_path / "worker.py").write_text(page_worker().replace("/data/wh", str(wh)))
    out, err = tmp_path / "worker.out", tmp_path / "worker.err"
    proc = subprocess.Popen([sys.executable, "worker.py"], cwd=tmp_path, stdout=out.open("w"),
                            stderr=err.open("w"), preexec_fn=_default_sigint)
    pattern = re.compile(r"^audit-1 shard (\d) snapshot \d+: (\d+) rows, amount ([\d.]+)$",
                         re.M)
    try:
        deadline = time.monotonic() + 120
        while sum(int(m[1]) for m in pattern.findall(out.read_text())) < 100:
            assert proc.poll() is None, err.read_text()[-3000:]
            assert time.monotonic() < deadline, (out.read_text(), err.read_text()[-3000:])
            time.sleep(0.2)
        found = pattern.findall(out.read_text())
        assert sum(int(m[1]) for m in found) == 100
        assert sum(float(m[2]) for m in found) == pytest.approx(sum(i * 1.5 for i in range(100)))
        assert {m[0] for m in found} == {"0", "1", "2", "3"}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, err.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert out.read_text().endswith("audit-1 left the group\n")
    logged = err.read_text()
    assert "Traceback" not in logged, logged[-3000:]
    assert "SIGTERM: handing shards off" in logged  # the member's INFO lines, as configured
