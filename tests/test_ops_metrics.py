"""Unit tests of :mod:`paimon_group.metrics` with a stand-in member (its public
attributes only) and a real Paimon table for lag. The real ``paimon-group run
--metrics-port`` process is scraped in ``test_ops_process.py``."""

from __future__ import annotations

import logging
import re
import select
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from paimon_group.config.timing import MemberTiming
from paimon_group.member import MemberState, MemberStats
from paimon_group.ops.http_server import IDLE_TIMEOUT_S, MAX_CONNECTIONS
from paimon_group.ops.metrics import MetricsServer, serve_metrics
from paimon_group.protocol.records import Assignment
from paimon_group.reading.table import ShardedTable
from tests.support.tables import make_pk_table, write_rows

HOST = "127.0.0.1"


class StandInMember:
    """The attributes of a GroupMember that metrics read, settable by tests."""

    def __init__(self, table: ShardedTable | None = None, num_shards: int = 0) -> None:
        self.group_name = "orders"
        self.member_id = "worker-1"
        self.config = SimpleNamespace(timing=MemberTiming.of(10.0),
                                      coordinator="etcd://admin:hunter2@127.0.0.1:2379/pg")
        self.stats = MemberStats()
        self.owned_shards: list[int] = []
        self.ready = False
        self.session_state = "connected"
        self.is_leader = False
        self.assignment: Assignment | None = None
        self.state = MemberState.RUNNING
        self.table = table
        self.num_shards = num_shards
        self.lag = 0.05
        self.positions: dict[int, int | None] = {}

    def loop_lag(self) -> float:
        return self.lag

    def shard_positions(self) -> dict[int, int | None]:
        return dict(self.positions)


def get(server: MetricsServer, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{server.port}{path}", timeout=30) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode()


def scrape(server: MetricsServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = get(server, "/metrics")
    assert status == 200
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    key = (name, tuple(sorted({"group": "orders", "member": "worker-1", **labels}.items())))
    return samples[key]


@pytest.fixture
def member() -> StandInMember:
    return StandInMember()


@pytest.fixture
def server(member: StandInMember) -> Any:
    s = serve_metrics(member, 0, host=HOST)
    yield s
    s.close()


def test_counters_gauges_and_states(member: StandInMember, server: MetricsServer) -> None:
    member.stats.batches, member.stats.rows, member.stats.commits = 7, 70, 8
    member.stats.rejected_commits, member.stats.refused_commits = 2, 1
    member.stats.rebalances, member.stats.handler_errors = 3, 4
    member.owned_shards = [1, 3]
    member.assignment = Assignment(generation=5, leader="worker-1", leader_epoch=9,
                                   shards={"worker-1": [1, 3, 4]})
    member.is_leader, member.ready = True, False
    samples = scrape(server)
    assert value(samples, "paimon_group_batches_total") == 7
    assert value(samples, "paimon_group_rows_total") == 70
    assert value(samples, "paimon_group_commits_total") == 8
    assert value(samples, "paimon_group_rejected_commits_total") == 2
    assert value(samples, "paimon_group_refused_commits_total") == 1
    assert value(samples, "paimon_group_rebalances_total") == 3
    assert value(samples, "paimon_group_handler_errors_total") == 4
    assert value(samples, "paimon_group_owned_shards") == 2
    assert value(samples, "paimon_group_assigned_shards") == 3
    assert value(samples, "paimon_group_generation") == 5
    assert value(samples, "paimon_group_leader") == 1
    assert value(samples, "paimon_group_ready") == 0
    assert value(samples, "paimon_group_session_state", state="connected") == 1
    assert value(samples, "paimon_group_session_state", state="suspended") == 0
    assert value(samples, "paimon_group_member_state", state="running") == 1
    member.session_state = "suspended"
    member.state = MemberState.REJOINING
    samples = scrape(server)
    assert value(samples, "paimon_group_session_state", state="suspended") == 1
    assert value(samples, "paimon_group_session_state", state="connected") == 0
    assert value(samples, "paimon_group_member_state", state="rejoining") == 1


def test_handler_latency_histogram_counts_each_duration_once(
    member: StandInMember, server: MetricsServer
) -> None:
    member.stats.handler_seconds.extend([0.001, 0.2, 7.0])
    samples = scrape(server)
    assert value(samples, "paimon_group_handler_seconds_count") == 3
    assert value(samples, "paimon_group_handler_seconds_bucket", le="0.005") == 1
    assert value(samples, "paimon_group_handler_seconds_bucket", le="0.25") == 2
    assert value(samples, "paimon_group_handler_seconds_bucket", le="+Inf") == 3
    assert value(samples, "paimon_group_handler_seconds_sum") == pytest.approx(7.201)
    member.stats.handler_seconds.append(400.0)
    samples = scrape(server)  # scraped twice: still each duration once
    assert value(samples, "paimon_group_handler_seconds_count") == 4
    assert value(samples, "paimon_group_handler_seconds_bucket", le="300.0") == 3
    assert value(samples, "paimon_group_handler_seconds_bucket", le="+Inf") == 4


def test_per_shard_lag_from_positions_and_the_latest_snapshot(tmp_path: Path) -> None:
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=2)
    for i in range(5):
        write_rows(wh, "db.t", range(i * 10, i * 10 + 10))
    table = ShardedTable.open(wh, "db.t")
    member = StandInMember(table, num_shards=2)
    member.owned_shards = [0, 1]
    member.positions = {0: 3, 1: 6}
    server = serve_metrics(member, 0, host=HOST)
    try:
        before = time.time()
        samples = scrape(server)
        assert value(samples, "paimon_group_table_latest_snapshot") == 5
        assert value(samples, "paimon_group_shards") == 2
        assert value(samples, "paimon_group_shard_lag_snapshots", shard="0") == 3
        assert value(samples, "paimon_group_shard_lag_snapshots", shard="1") == 0
        assert value(samples, "paimon_group_shard_position", shard="0") == 3
        assert value(samples, "paimon_group_lag_snapshots") == 3
        commit_3 = (table.snapshot_commit_time_ms(3) or 0) / 1000.0
        assert value(samples, "paimon_group_shard_lag_seconds", shard="0") >= before - commit_3
        assert value(samples, "paimon_group_shard_lag_seconds", shard="1") == 0
        assert value(samples, "paimon_group_shard_lag_rows", shard="1") == 0
        # Rows: the three unread snapshots added 10 rows each, over both buckets.
        member.positions = {0: 3, 1: 3}
        time.sleep(server.collector.lag_refresh_s)
        samples = scrape(server)
        rows = [value(samples, "paimon_group_shard_lag_rows", shard=s) for s in ("0", "1")]
        assert sum(rows) == 30 and all(r > 0 for r in rows), rows
        assert value(samples, "paimon_group_lag_rows") == 30
        # Shards no longer owned disappear from the per-shard series.
        member.owned_shards = [1]
        member.positions = {1: 6}
        time.sleep(server.collector.lag_refresh_s)
        samples = scrape(server)
        assert not any(k[0] == "paimon_group_shard_lag_snapshots" and ("shard", "0") in k[1]
                       for k in samples)
    finally:
        server.close()


def test_health_follows_the_loop_and_readiness_follows_ready(
    member: StandInMember, server: MetricsServer
) -> None:
    assert get(server, "/healthz")[0] == 200
    assert get(server, "/readyz") == (503, "not ready\n")
    member.ready = True
    assert get(server, "/readyz") == (200, "ready\n")
    member.lag = server.max_loop_lag_s + 1
    status, body = get(server, "/healthz")
    assert status == 503 and "stalled" in body
    # Not looping (joining, reconnecting): alive is all that can be said.
    member.state = MemberState.JOINING
    assert get(server, "/healthz")[0] == 200
    member.state = MemberState.FAILED
    assert get(server, "/healthz") == (503, "member failed\n")
    assert get(server, "/nope")[0] == 404


def test_probes_answer_while_the_event_loop_is_blocked(member: StandInMember) -> None:
    import asyncio

    server = serve_metrics(member, 0, host=HOST)
    answers: list[int] = []

    async def blocked_loop() -> None:
        # This coroutine never yields: the loop is blocked while the probe runs.
        probe = threading.Thread(target=lambda: answers.append(get(server, "/healthz")[0]))
        probe.start()
        probe.join(timeout=60)

    try:
        asyncio.run(blocked_loop())
    finally:
        server.close()
    assert answers == [200]


def test_no_credential_in_any_metric_and_a_registry_per_member(
    member: StandInMember, server: MetricsServer
) -> None:
    other = StandInMember()
    other.member_id = "worker-2"
    second = serve_metrics(other, 0, host=HOST)
    try:
        _, text = get(server, "/metrics")
        assert "hunter2" not in text and "admin" not in text and "2379" not in text
        _, text2 = get(second, "/metrics")
        assert 'member="worker-2"' in text2 and 'member="worker-1"' not in text2
        # Nothing of ours in the process-global registry.
        assert "paimon_group" not in prometheus_client.generate_latest().decode()
    finally:
        second.close()


def test_close_frees_the_port(member: StandInMember) -> None:
    server = serve_metrics(member, 0, host=HOST)
    port = server.port
    server.close()
    again = serve_metrics(member, port, host=HOST)
    try:
        assert get(again, "/healthz")[0] == 200
    finally:
        again.close()


def held_open(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the server has not closed (nothing was sent on them)."""
    count = 0
    for sock in socks:
        sock.setblocking(False)
        try:
            if sock.recv(1):
                count += 1
        except BlockingIOError:
            count += 1
        except OSError:
            pass
    return count


def test_idle_connections_take_no_thread_and_the_probes_still_answer(
    member: StandInMember, server: MetricsServer
) -> None:
    """Issue 44: a thread per connection, kept while the client sent nothing:
    400 idle connections made a member grow from 13 to 413 threads. Now they
    cost no thread, at most MAX_CONNECTIONS stay open (the oldest idle one is
    closed for a new one), and the probes answer meanwhile."""
    assert get(server, "/metrics")[0] == 200  # the server's own threads started
    before = threading.active_count()
    socks = [socket.create_connection((HOST, server.port), timeout=10) for _ in range(400)]
    try:
        time.sleep(0.5)
        during = threading.active_count()
        assert get(server, "/healthz")[0] == 200
        assert get(server, "/metrics")[0] == 200
        assert during <= before + 2, f"{during - before} more threads for 400 idle connections"
        assert held_open(socks) <= MAX_CONNECTIONS
    finally:
        for sock in socks:
            sock.close()


def test_a_silent_or_trickling_client_is_closed_after_the_idle_timeout(
    member: StandInMember, server: MetricsServer
) -> None:
    """A connection that sends nothing, or its request a byte at a time, is
    closed once IDLE_TIMEOUT_S have passed without a whole request (a deadline
    for the request, not for each read)."""
    silent = socket.create_connection((HOST, server.port), timeout=30)
    trickle = socket.create_connection((HOST, server.port), timeout=30)
    started = time.monotonic()
    closed_at = None
    with silent, trickle:
        for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\n" * 10:
            try:
                trickle.sendall(bytes([byte]))
            except OSError:
                closed_at = time.monotonic()
                break
            readable, _, _ = select.select([trickle], [], [], 0.25)
            if readable and trickle.recv(1) == b"":
                closed_at = time.monotonic()
                break
        assert closed_at is not None, "the trickling client was never closed"
        assert IDLE_TIMEOUT_S - 0.5 <= closed_at - started <= IDLE_TIMEOUT_S + 3
        assert silent.recv(1) == b""  # closed, long before its 30 s
        assert time.monotonic() - started <= IDLE_TIMEOUT_S + 3
    assert get(server, "/readyz")[0] == 503  # and the server still answers


def ask(server: MetricsServer, request: bytes) -> bytes:
    """Send ``request`` as it is over a real socket; the whole answer."""
    with socket.create_connection((HOST, server.port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_closing_with_open_connections_logs_no_error(
    member: StandInMember, caplog: pytest.LogCaptureFixture
) -> None:
    """A server closed while clients hold connections (a member stopping while
    Prometheus or a probe is connected) ends them quietly: no asyncio ERROR
    with a traceback per connection."""
    server = serve_metrics(member, 0, host=HOST)
    assert get(server, "/healthz")[0] == 200
    socks = [socket.create_connection((HOST, server.port), timeout=10) for _ in range(5)]
    socks[0].sendall(b"GET /healthz HTTP/1.1\r\n")  # a request begun, not ended
    try:
        time.sleep(0.3)
        with caplog.at_level(logging.DEBUG):
            server.close()
            time.sleep(0.2)
    finally:
        for sock in socks:
            sock.close()
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert errors == [], [f"{r.name}: {r.getMessage()}" for r in errors]


def test_head_is_answered_as_get_without_a_body(server: MetricsServer) -> None:
    get_answer = ask(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    head_answer = ask(server, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = head_answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 "), head_answer
    assert body == b""
    assert head == get_answer.partition(b"\r\n\r\n")[0]  # the same length and type
    missing = ask(server, b"HEAD /nowhere HTTP/1.1\r\n\r\n")
    assert missing.startswith(b"HTTP/1.0 404 ") and missing.endswith(b"\r\n\r\n")
    other = ask(server, b"POST /healthz HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert other.startswith(b"HTTP/1.0 501 ") and b"Allow: GET, HEAD\r\n" in other


@pytest.mark.parametrize("target", [f"http://{HOST}/healthz", "HTTP://host:9000/healthz?x=1",
                                    "/healthz?probe=1"])
def test_a_request_target_in_absolute_form_is_answered(server: MetricsServer,
                                                      target: str) -> None:
    """HTTP/1.1 servers accept the absolute form (``GET http://host/path``),
    which a client sends through a proxy."""
    answer = ask(server, f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.0 200 ") and b"\r\n\r\nrunning" in answer, answer


# -- the metrics table of docs/operations.md is the code's ---------------------------

OPERATIONS = Path(__file__).resolve().parents[1] / "docs" / "operations.md"


def exported_families(tmp_path: Path) -> dict[str, str]:
    """Name (as scraped: counters with ``_total``) -> type, of every family a
    member exports, read from a real scrape of a member that has them all."""
    wh = str(tmp_path / "wh")
    make_pk_table(wh, "db.t", buckets=2)
    write_rows(wh, "db.t", range(10))
    member = StandInMember(ShardedTable.open(wh, "db.t"), num_shards=2)
    member.owned_shards = [0]
    member.positions = {0: 1}
    member.stats.handler_seconds.append(0.01)
    server = serve_metrics(member, 0, host=HOST)
    try:
        status, text = get(server, "/metrics")
    finally:
        server.close()
    assert status == 200
    return {(f.name + "_total" if f.type == "counter" else f.name): f.type
            for f in text_string_to_metric_families(text) if f.name.startswith("paimon_group")}


def documented_families() -> dict[str, str]:
    """Name -> type of every metric in the table under "### Metrics"."""
    text = OPERATIONS.read_text()
    section = text[text.index("### Metrics"):]
    section = section[:section.index("\n#", 1)]
    out: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or "paimon_group_" not in cells[0]:
            continue
        for name in re.findall(r"`(paimon_group_[a-z_]+)", cells[0]):
            out[name] = cells[1]
    return out


def test_the_documented_metrics_are_exactly_the_exported_ones(tmp_path: Path) -> None:
    """docs/operations.md's metrics table names every family the code exports,
    with its type, and nothing else; on a mismatch the right rows are printed."""
    exported = exported_families(tmp_path)
    documented = documented_families()
    missing = {n: t for n, t in exported.items() if documented.get(n) != t}
    extra = sorted(set(documented) - set(exported))
    rows = "\n".join(f"| `{n}` | {t} | ... |" for n, t in sorted(missing.items()))
    assert not missing and not extra, (
        f"docs/operations.md metrics table: add or fix\n{rows}\nremove {extra}")


def test_every_state_label_value_is_documented() -> None:
    """docs/operations.md's rows of the state gauges name every value they take."""
    from paimon_group.ops.metrics import MEMBER_STATES, SESSION_STATES

    section = OPERATIONS.read_text()
    section = section[section.index("### Metrics"):]
    for family, states in (("paimon_group_session_state", SESSION_STATES),
                           ("paimon_group_member_state", MEMBER_STATES)):
        row = next(line for line in section.splitlines() if f"`{family}{{state}}`" in line)
        missing = [s for s in states if f"`{s}`" not in row]
        assert not missing, (family, missing)
