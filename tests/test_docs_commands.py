"""Every command line of README.md and docs/*.md is run by a test (issue 27).

The shell blocks (```bash, ```sh, ```console) are parsed line by line, and
each line is accounted for by exactly one rule of :data:`RULES`:

``run``
    ``paimon-group`` lines run here as written, in doc order within a block,
    with these replacements only (a user's hosts and paths are not ours):
    the warehouse (``/data/wh``, ``s3://...``) becomes a local warehouse
    holding the tables the lines name; coordinator hosts become the suite's
    real servers (an ``etcds://`` line a TLS etcd, a ZooKeeper line with a CA
    a TLS ZooKeeper, a line with credentials a server that checks them),
    keeping the URL's path and query; file paths (``ca.pem``,
    ``/run/secrets/...``, ``--config``) become files holding what the doc
    says they hold (the TOML of docs/operations.md); ``...`` becomes the
    options the block's other lines give; ``[a | b]`` runs once without and
    once with each alternative. ``run`` lines start a worker and wait until it
    owns shards, then stop it (SIGTERM, exit 0); ``--watch`` lines print a
    first frame and are stopped; every other line exits 0. A group an admin
    line names is created first by a worker if no earlier line did.
    The test commands (``pytest ...``) are collected as written; benchmark
    names are checked against the benchmarks there are.
``covered``
    run word for word by the named test (the first pipeline, the demo).
``static``
    needs what a test machine has not (a Kubernetes cluster, Docker, a
    remote Spark Connect endpoint, ``etcdctl``): every repository path the
    line names exists; tests/test_deploy.py renders the manifests.
``output``
    example output: it has the shape the code prints.

A line no rule accounts for fails :func:`test_every_doc_command_is_accounted_for`.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.group_procs import REPO

pytestmark = [pytest.mark.slow]

DOCS = ["README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"```(?:bash|sh|console|shell)\n(.*?)```", re.S)


@dataclass(frozen=True)
class DocLine:
    doc: str
    line: int  # of the block's first line
    text: str  # continuations joined, trailing comment kept

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def doc_blocks() -> list[tuple[str, int, list[str]]]:
    """(doc, line of the block, its command lines) for every shell block."""
    out = []
    for doc in DOCS:
        text = (REPO / doc).read_text()
        for m in BLOCK.finditer(text):
            line = text[:m.start()].count("\n") + 2
            lines = [ln.strip() for ln in m.group(1).replace("\\\n", " ").splitlines()]
            out.append((doc, line, [ln for ln in lines if ln and not ln.startswith("#")]))
    return out


def doc_lines() -> list[DocLine]:
    return [DocLine(doc, line, text) for doc, line, lines in doc_blocks() for text in lines]


def in_first_pipeline(d: DocLine) -> bool:
    text = (REPO / "README.md").read_text()
    begin = text[:text.index("<!-- first-pipeline:begin")].count("\n")
    end = text[:text.index("first-pipeline:end -->")].count("\n")
    return d.doc == "README.md" and begin < d.line < end


# (how, test): ordered; the first whose predicate holds accounts for the line.
RULES: list[tuple[str, str, Any]] = [
    ("covered", "tests/test_readme_pipeline.py::test_first_pipeline_word_for_word",
     in_first_pipeline),
    ("covered", "tests/test_readme_pipeline.py (python -m venv, pip install .) and "
     "tests/test_demo.py::test_demo_delivers_every_row (the demo)",
     lambda d: d.text.startswith("python3 -m venv .venv && .venv/bin/pip install . &&")),
    ("covered", "the suite itself: .ci/run runs it",
     lambda d: d.text == "bash tests/run.sh"),
    ("covered", "the fast lane: .ci/run runs it on each other supported Python it finds",
     lambda d: d.text.endswith("bash tests/run.sh --fast")),
    ("covered", "tests/test_spark_source_requirements.py (the extra is what works)",
     lambda d: d.text.startswith(".venv/bin/pip install '.[spark]'")),
    ("run", "test_a_test_command_collects_as_written",
     lambda d: d.text.startswith(".venv/bin/pytest ")),
    ("run", "test_the_benchmarks_named_exist",
     lambda d: d.text.startswith(".venv/bin/python -m tests.benchmarks.run")),
    ("run", "test_doc_block_runs_as_written", lambda d: d.text.startswith("paimon-group ")),
    ("run", "test_the_spark_example_runs",
     lambda d: d.text.split("#")[0].strip() == "python docs/examples/spark_pipeline/run.py"),
    ("covered", "test_the_spark_example_runs runs the same program with its defaults; these "
     "lines change the worker count and the kill, or point it at a Spark Connect server (a "
     "cluster's, or one started from PySpark) that a test machine does not run",
     lambda d: d.text.startswith("python docs/examples/spark_pipeline/run.py ")),
    ("static", "a Kubernetes cluster and Docker",
     lambda d: re.match(r"(kubectl|kind|docker|curl) ", d.text) is not None),
    ("static", "etcdctl (Debian etcd-client; CI installs etcd-server)",
     lambda d: d.text.startswith("etcdctl ")),
    ("output", r"deleted group \S+: \d+ coordinator keys, \d+ consumer files",
     lambda d: d.text.startswith("deleted group ")),
]


def rule_of(d: DocLine) -> tuple[str, str]:
    for how, what, holds in RULES:
        if holds(d):
            return how, what
    return "none", ""


def test_every_doc_command_is_accounted_for() -> None:
    lines = doc_lines()
    assert len(lines) > 50
    missing = [d.where + " " + d.text for d in lines if rule_of(d)[0] == "none"]
    assert not missing, missing
    ran = [d for d in lines if rule_of(d)[0] == "run"]
    assert len([d for d in ran if d.text.startswith("paimon-group")]) > 25


def test_static_lines_name_paths_that_exist() -> None:
    for d in doc_lines():
        if rule_of(d)[0] != "static":
            continue
        for word in shlex.split(d.text, comments=True):
            if word.startswith("deploy/"):
                assert (REPO / word).exists(), (d.where, word)


def test_example_output_has_the_shape_printed(tmp_path: Path) -> None:
    env = prepare(tmp_path, {})
    where = ["--warehouse", str(env.wh), "--table", "shop.orders"]
    create_group(env, ["--group", "gone", *where])
    printed = cli(env, ["delete", "--group", "gone", *where])
    for d in doc_lines():
        how, shape = rule_of(d)
        if how == "output":
            assert re.fullmatch(shape, d.text), d.text
            assert re.search(shape, printed), printed


def test_a_test_command_collects_as_written() -> None:
    for d in doc_lines():
        if not d.text.startswith(".venv/bin/pytest "):
            continue
        args = shlex.split(d.text, comments=True)[1:]
        done = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", *args], cwd=REPO,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (d.where, done.stdout[-2000:], done.stderr[-2000:])
        assert re.search(r"\d+ tests? collected", done.stdout), (d.where, done.stdout[-500:])


def test_the_benchmarks_named_exist() -> None:
    from tests.benchmarks.run import discover

    names = set()
    for m in discover():
        names |= {m.TITLE, m.__name__.split(".")[-1].removeprefix("bench_")}
    for d in doc_lines():
        if d.text.startswith(".venv/bin/python -m tests.benchmarks.run"):
            words = shlex.split(d.text, comments=True)[3:]
            unknown = [w for w in words if not w.startswith("-") and w not in names]
            assert not unknown, (d.where, unknown, sorted(names))


# -- running the paimon-group lines ------------------------------------------


@dataclass
class Env:
    """Where a block's lines run: a scratch directory (the current directory,
    holding the handler modules), its warehouse and the suite's servers."""

    tmp: Path
    servers: dict[str, Any]
    prefix: str = field(default_factory=lambda: "docs-" + uuid.uuid4().hex[:8])

    @property
    def wh(self) -> Path:
        return self.tmp / "wh"

    def secret(self, name: str, text: str) -> str:
        path = self.tmp / "secrets" / name.strip("/").replace("/", "_")
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        return str(path)


# A plain handler takes (batch), a Spark handler (df, batch): this one is both.
HANDLER = ("def handle(*args):\n    batch = args[-1]\n"
           "    print(batch.shard, batch.to_arrow().num_rows, flush=True)\n")
# What a ``...`` stands for when the block's lines do not say.
DEFAULTS = {"--group": "orders", "--warehouse": "/data/wh", "--table": "db.orders",
            "--handler": "my_jobs:handle"}
TABLES = {"db.orders": 12, "dw.orders": 4, "shop.orders": 4, "shop.items": 2}
ETCD_PASSWORD = "pg-Pa55word"


def prepare(tmp: Path, servers: dict[str, Any]) -> Env:
    from tests.support.tables import make_pk_table, write_rows

    env = Env(tmp, servers)
    for name, buckets in TABLES.items():
        make_pk_table(str(env.wh), name, buckets=buckets)
        write_rows(str(env.wh), name, range(40))
    for module in ("my_jobs", "handler", "search_sink", "enrich", "events", "enrich_spark"):
        (tmp / f"{module}.py").write_text(HANDLER)
    return env


def coordinator_url(env: Env, url: str, words: list[str]) -> str:
    """The doc's URL with its hosts replaced by the suite's server for it
    (its path under a fresh root, its query kept)."""
    scheme, rest = url.split("://", 1)
    _, _, tail = rest.partition("/")
    path, _, query = tail.partition("?")
    secured = "--coordinator-ca" in words
    if scheme.startswith("etcd"):
        secret = "--coordinator-username" in words
        server = env.servers[("etcds-auth" if secret else "etcds") if scheme == "etcds"
                             else "etcd"]
        real = server.endpoint
    else:
        server = env.servers["zk-tls" if secured else "zk"]
        real = (f"localhost:{server.secure_port}" if secured else server.hosts)
    url = f"{scheme}://{real}/{env.prefix}/{path or 'root'}"
    return f"{url}?{query}" if query else url


def localize(env: Env, words: list[str], context: dict[str, str]) -> list[str]:
    """A doc line's words as run here (see the module docstring)."""
    out: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        value = words[i + 1] if i + 1 < len(words) else ""
        if w == "...":
            wanted = [k for k in context if k not in words
                      and (k != "--handler" or words[1] == "run")
                      and (k != "--spark-handler" or words[1] == "run")]
            if "--spark-handler" in words:
                wanted = [k for k in wanted if k != "--handler"]
            out += localize(env, [x for k in wanted for x in (k, context[k])], context)
        elif w == "--warehouse":
            out += [w, str(env.wh)]
        elif w == "--coordinator":
            url = context.get("--coordinator", "etcd://etcd-0:2379/paimon-group") \
                if value == "..." else value
            out += [w, coordinator_url(env, url, words)]
        elif w == "--coordinator-ca":
            out += [w, str(ca_for(env, words))]
        elif w == "--coordinator-password-file":
            out += [w, env.secret(value, password_for(words))]
        elif w == "--config":
            out += [w, write_config(env)]
        elif w == "--catalog-option" and value.startswith("s3."):
            pass  # an object-store option: this warehouse is local
        elif w == "--spark-master":
            out += [w, "local[1]"]
        else:
            out.append(w)
            i += 1
            continue
        i += 1 if w == "..." else 2
    return out


def ca_for(env: Env, words: list[str]) -> Path:
    url = words[words.index("--coordinator") + 1] if "--coordinator" in words else ""
    if url.startswith("zk"):
        return Path(env.servers["zk-tls-material"].ca)
    return Path(env.servers["etcd-pki"].ca)


def password_for(words: list[str]) -> str:
    url = words[words.index("--coordinator") + 1] if "--coordinator" in words else ""
    return "zk-digest-secret" if url.startswith("zk") else ETCD_PASSWORD


def write_config(env: Env) -> str:
    """docs/operations.md's TOML, with its paths, hosts and port made ours."""
    text = (REPO / "docs/operations.md").read_text()
    toml = re.search(r"```toml\n(# /etc/paimon-group/\S+\n.*?)```", text, re.S)
    assert toml is not None
    body = toml.group(1)
    url = re.search(r'coordinator = "([^"]+)"', body)
    assert url is not None
    words = ["--coordinator", url.group(1), "--coordinator-ca", "x",
             "--coordinator-username", "paimon-group"]
    for key, new in [
        ("warehouse", str(env.wh)),
        ("coordinator", coordinator_url(env, url.group(1), words)),
        ("coordinator-ca", str(ca_for(env, words))),
        ("coordinator-password-file", env.secret("coordinator-password", ETCD_PASSWORD)),
        ("metrics-port", str(free_port())),
    ]:
        body = re.sub(rf'(?m)^{re.escape(key)} = .*$',
                      f"{key} = {new}" if key == "metrics-port" else f'{key} = "{new}"', body)
    body = re.sub(r'(?m)^"s3\.endpoint" = .*$', "", body)
    path = env.tmp / "orders-to-search.toml"
    path.write_text(body)
    return str(path)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def variants(text: str) -> list[str]:
    """``cmd [--a | --b]`` -> cmd, cmd --a, cmd --b."""
    m = re.search(r"\s\[(--.*\|.*)\]\s*(#.*)?$", text)
    if m is None:
        return [text]
    head = text[:m.start()]
    return [head, *(f"{head} {alt.strip()}" for alt in m.group(1).split(" | "))]


def child_env(env: Env) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(env.tmp), str(REPO)]),
            "COLUMNS": "200"}


def cli(env: Env, args: list[str], *, timeout: float = 120) -> str:
    done = subprocess.run([sys.executable, "-m", "paimon_group", *args], cwd=env.tmp,
                          env=child_env(env), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


@dataclass
class Worker:
    proc: subprocess.Popen[str]
    log: Path

    def wait_owns(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while "acquired shards" not in self.log.read_text():
            assert self.proc.poll() is None and time.monotonic() < deadline, \
                self.log.read_text()[-3000:]
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        assert rc == 0, self.log.read_text()[-3000:]


def start_worker(env: Env, args: list[str]) -> Worker:
    log = env.tmp / f"worker-{uuid.uuid4().hex[:6]}.log"
    proc = subprocess.Popen([sys.executable, "-m", "paimon_group", *args], cwd=env.tmp,
                            env=child_env(env), stdout=log.open("w"),
                            stderr=subprocess.STDOUT, text=True)
    return Worker(proc, log)


def create_group(env: Env, options: list[str], member: str = "") -> Worker | None:
    """A worker of the group in ``options`` owns shards; it is stopped, unless
    ``member`` names it (it then stays, for ``members remove``)."""
    worker = start_worker(env, ["run", *options, "--handler", "my_jobs:handle",
                                *(["--member-id", member] if member else [])])
    try:
        worker.wait_owns()
    except BaseException:
        worker.proc.kill()
        raise
    if member:
        return worker
    worker.stop()
    return None


def block_context(lines: list[str]) -> dict[str, str]:
    """The options the block's lines give (for its ``...``)."""
    context: dict[str, str] = {}
    for text in lines:
        words = shlex.split(text, comments=True)
        for key in ("--warehouse", "--table", "--coordinator"):
            if key in words and key not in context and words[words.index(key) + 1] != "...":
                context[key] = words[words.index(key) + 1]
    for key, value in DEFAULTS.items():
        context.setdefault(key, value)
    return context


def run_line(env: Env, text: str, context: dict[str, str], made: set[tuple[str, str]],
             keep: list[Worker]) -> None:
    words = localize(env, shlex.split(text, comments=True), context)
    base = words[1:]
    command = base[0]
    group = base[base.index("--group") + 1] if "--group" in base else ""
    coordinator = base[base.index("--coordinator") + 1] if "--coordinator" in base else ""
    if command == "run":
        worker = start_worker(env, base)
        try:
            worker.wait_owns()
        finally:
            worker.stop()
        made.add((group, coordinator))
        return
    table = base[base.index("--table") + 1] if "--table" in base else DEFAULTS["--table"]
    where = ["--warehouse", str(env.wh), "--table", table,
             *(["--coordinator", coordinator] if coordinator else [])]
    if command == "members":  # `members remove ... ID`: a live member of that id
        member = base[-1] if base[-1] != "MEMBER_ID" else "w-remove"
        base[-1] = member
        live = create_group(env, ["--group", group, *where], member=member)
        assert live is not None
        keep.append(live)
    elif group and (group, coordinator) not in made and command in ("describe", "reset",
                                                                    "delete"):
        create_group(env, ["--group", group, *where])
        made.add((group, coordinator))
    if "--all-groups" in base or command == "list":
        if not made:
            create_group(env, ["--group", "any", *where])
            made.add(("any", coordinator))
    if "--watch" in base:
        watch(env, base)
        return
    printed = cli(env, base)
    assert printed.strip(), (text, "printed nothing")
    if command == "delete":
        made.discard((group, coordinator))


def watch(env: Env, args: list[str]) -> None:
    log = env.tmp / "watch.log"
    proc = subprocess.Popen([sys.executable, "-m", "paimon_group", *args], cwd=env.tmp,
                            env=child_env(env), stdout=log.open("w"),
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not re.search(r"shard|\{", log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=30)
    assert rc in (0, 130), (rc, log.read_text()[-2000:])


def paimon_group_blocks() -> list[tuple[str, list[str]]]:
    out = []
    for doc, line, lines in doc_blocks():
        ours = [t for t in lines if rule_of(DocLine(doc, line, t))[0] == "run"
                and t.startswith("paimon-group ")]
        if ours:
            out.append((f"{doc}:{line}", ours))
    return out


@pytest.fixture(scope="module")
def servers(etcd_pki: Any, zk_tls: Any, zk_server: Any, etcd_server: Any,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from tests.support.etcd_server import EtcdServer, require_etcd
    from tests.support.zk_server import ZkServer, require_zookeeper

    etcds = EtcdServer(require_etcd(), tmp_path_factory.mktemp("etcds"), pki=etcd_pki,
                       tls=True)
    etcds_auth = EtcdServer(require_etcd(), tmp_path_factory.mktemp("etcds-auth"),
                            pki=etcd_pki, tls=True, auth=True,
                            users={"paimon-group": ETCD_PASSWORD})
    java, jar = require_zookeeper()
    zk_tls_server = ZkServer(java, jar, tmp_path_factory.mktemp("zk-tls"), tls=zk_tls,
                             client_auth="none")
    try:
        etcds.start()
        etcds_auth.start()
        zk_tls_server.start()
        yield {"etcd": etcd_server, "etcds": etcds, "etcds-auth": etcds_auth,
               "etcd-pki": etcd_pki, "zk": zk_server, "zk-tls": zk_tls_server,
               "zk-tls-material": zk_tls}
    finally:
        etcds.stop()
        etcds_auth.stop()
        zk_tls_server.stop()


@pytest.mark.parametrize("where,lines", paimon_group_blocks(),
                         ids=[w for w, _ in paimon_group_blocks()])
def test_doc_block_runs_as_written(tmp_path: Path, servers: dict[str, Any], where: str,
                                   lines: list[str]) -> None:
    env = prepare(tmp_path, servers)
    context = block_context(lines)
    made: set[tuple[str, str]] = set()
    keep: list[Worker] = []
    try:
        for text in lines:
            for variant in variants(text):
                if "--spark-remote" in variant:
                    continue  # a Spark Connect endpoint: the local master runs instead
                run_line(env, variant, context, made, keep)
    finally:
        for worker in keep:
            if worker.proc.poll() is None:
                worker.proc.kill()
            worker.proc.wait()


@pytest.mark.spark
def test_the_spark_example_runs() -> None:
    """docs/spark.md's first example line, word for word (3 workers with local
    Spark, one SIGKILLed half way): it ends with its exactly-once check."""
    from tests.support.requirements import require

    require("pyspark", "pip install '.[spark]' (tests/run.sh installs it)")
    line = next(d for d in doc_lines()
                if d.doc == "docs/spark.md" and d.text.startswith("python docs/examples/"))
    words = shlex.split(line.text, comments=True)
    assert words == ["python", "docs/examples/spark_pipeline/run.py"], words
    done = subprocess.run([sys.executable, *words[1:]], cwd=REPO, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert "exactly-once check: PASSED" in done.stdout, done.stdout[-3000:]
