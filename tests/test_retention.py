"""The time-to-data-loss model (paimon_group/ops/retention.py): Paimon's expiry
rules, consumer-file protection and the rates, on numbers worked by hand; and
the consumer files as a real table holds them."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest

from paimon_group.ops.retention import (
    ConsumerFile,
    DataLossEstimate,
    RateMeter,
    Retention,
    consumer_files,
    earliest_loss,
    estimate,
    protection_s,
)
from paimon_group.protocol.names import consumer_id
from paimon_group.reading.mirror import ConsumerMirror
from tests.support.tables import make_pk_table, open_table, write_rows


def test_retention_options_and_paimon_defaults() -> None:
    assert Retention.of_options({}) == Retention(10, None, 3600.0, None, True)
    r = Retention.of_options({"snapshot.num-retained.min": "3", "snapshot.num-retained.max": "50",
                              "snapshot.time-retained": "30 min",
                              "consumer.expiration-time": "1 d", "write-only": "true"})
    assert r == Retention(3, 50, 1800.0, 86400.0, False)
    # A value Paimon would refuse keeps the default rather than breaking describe.
    assert Retention.of_options({"snapshot.time-retained": "soon"}).time_retained_s == 3600.0


RET = Retention(num_retained_min=10, num_retained_max=100, time_retained_s=600.0)


def test_a_stalled_shard_loses_its_snapshot_when_it_is_old_enough() -> None:
    # 50 newer snapshots (> min 10), 400 s old: expires once 600 s old, in 200 s.
    est = estimate(RET, position=50, latest=100, oldest_age_s=400.0, write_rate=0.1,
                   read_rate=0.0, protection_s=0.0)
    assert est == DataLossEstimate(200.0, "at risk")


def test_the_count_rules() -> None:
    # Only 4 newer: min 10 is reached after 6 more commits (60 s at 0.1/s),
    # although the snapshot is already older than time-retained.
    assert estimate(RET, position=96, latest=100, oldest_age_s=900.0, write_rate=0.1,
                    read_rate=0.0, protection_s=0.0).seconds == pytest.approx(60.0)
    # num-retained.max wins over time: 90 newer, 10 more commits at 1/s.
    assert estimate(RET, position=10, latest=100, oldest_age_s=5.0, write_rate=1.0,
                    read_rate=0.0, protection_s=0.0).seconds == pytest.approx(10.0)
    # Already past both: the next commit may expire it.
    assert estimate(RET, position=1, latest=200, oldest_age_s=5.0, write_rate=1.0,
                    read_rate=0.0, protection_s=0.0).seconds == 0.0


def test_the_read_rate_slows_the_loss_down_or_avoids_it() -> None:
    # Reading at half the write rate: its oldest unread ages at half speed.
    est = estimate(RET, position=50, latest=100, oldest_age_s=400.0, write_rate=0.2,
                   read_rate=0.1, protection_s=0.0)
    assert est.seconds == pytest.approx(400.0)
    fast = estimate(RET, position=95, latest=100, oldest_age_s=30.0, write_rate=0.1,
                    read_rate=0.5, protection_s=0.0)
    assert fast == DataLossEstimate(None, "reading faster than written")


def test_consumer_files_protect_until_they_expire() -> None:
    files = [ConsumerFile("pg-g-shard-0", 40, age_s=100.0),
             ConsumerFile("pg-g-shard-1", 70, age_s=1.0)]
    forever = Retention(consumer_expiration_s=None)
    assert protection_s(files, 50, forever) == math.inf
    # A consumer file ahead of the position protects nothing.
    assert protection_s(files, 30, forever) == 0.0
    day = Retention(consumer_expiration_s=300.0)
    assert protection_s(files, 50, day) == 200.0
    assert protection_s(files, 80, day) == 299.0  # the youngest protecting file
    protected = estimate(RET, position=50, latest=100, oldest_age_s=900.0, write_rate=0.1,
                         read_rate=0.0, protection_s=math.inf)
    assert protected == DataLossEstimate(None, "protected")
    # Protection ends in 200 s; the snapshot is expirable by then.
    assert estimate(RET, position=50, latest=100, oldest_age_s=900.0, write_rate=0.1,
                    read_rate=0.0, protection_s=200.0).seconds == 200.0


def test_nothing_expires_without_commits_or_unread_snapshots() -> None:
    assert estimate(RET, position=50, latest=100, oldest_age_s=900.0, write_rate=0.0,
                    read_rate=0.0, protection_s=0.0).why == "no commits"
    assert estimate(RET, position=101, latest=100, oldest_age_s=0.0, write_rate=1.0,
                    read_rate=0.0, protection_s=0.0).why == "caught up"
    write_only = Retention(expires=False)
    assert estimate(write_only, position=1, latest=100, oldest_age_s=1e6, write_rate=1.0,
                    read_rate=0.0, protection_s=0.0).seconds is None


def test_the_group_takes_its_slowest_shard() -> None:
    assert earliest_loss([DataLossEstimate(None, "protected"), DataLossEstimate(30.0, "at risk"),
                          DataLossEstimate(5.0, "at risk")]).seconds == 5.0
    assert earliest_loss([DataLossEstimate(None, "caught up"),
                          DataLossEstimate(None, "protected")]).why == "protected"
    assert earliest_loss([]).why == "caught up"


def test_rate_meter() -> None:
    meter = RateMeter(window_s=10.0)
    for t in range(0, 30):
        meter.add(100 + 2 * t, now=float(t))
    assert meter.rate() == pytest.approx(2.0)
    meter.add(5, now=31.0)  # reset backwards: start over
    assert meter.rate() == 0.0
    # Reading as fast as the table is written, then stalled: the rate falls
    # at once (its largest move per second since), not over the window.
    stalled = RateMeter(window_s=60.0)
    for t in range(0, 20):
        stalled.add(2 * t, now=float(t))
    for t in range(20, 30):
        stalled.add(38, now=float(t))
    assert stalled.rate() == pytest.approx(2 / 10)


def test_consumer_files_of_a_real_table(tmp_path: Path) -> None:
    make_pk_table(str(tmp_path), "db.t", buckets=2)
    write_rows(str(tmp_path), "db.t", range(10))
    table = open_table(str(tmp_path), "db.t")
    mirror = ConsumerMirror(table.file_io, str(table.table_path), "g")
    mirror.write(0, 7, force=True)
    mirror.write(1, 3, force=True, full_scan_pending=True)
    path = str(table.table_path).removeprefix("file://")
    old = time.time() - 500
    os.utime(f"{path}/consumer/consumer-{consumer_id('g', 1)}", (old, old))
    found = {c.consumer_id: c for c in consumer_files(table.file_io, str(table.table_path))}
    assert {k: c.next_snapshot for k, c in found.items()} == {
        consumer_id("g", 0): 7, consumer_id("g", 1): 3}
    assert found[consumer_id("g", 0)].age_s < 60
    assert 490 < found[consumer_id("g", 1)].age_s < 560


def test_snapshot_facts_estimate_each_lagging_shard(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """On a real table: the options, the commit times, the consumer files."""
    from paimon_group.ops import lag
    from paimon_group.ops.lag import SnapshotFacts
    from paimon_group.reading.table import ShardedTable

    monkeypatch.setattr(lag, "CONSUMER_FILES_REFRESH_S", 0.0)  # read them every time

    make_pk_table(str(tmp_path), "db.t", buckets=2, options={
        "snapshot.num-retained.min": "2", "snapshot.time-retained": "10 min",
        "consumer.expiration-time": "1 h"})
    for k in range(6):
        write_rows(str(tmp_path), "db.t", range(10 * k, 10 * k + 10))
    table = ShardedTable.open(str(tmp_path), "db.t")
    facts = SnapshotFacts(table, 2)
    now = time.time()
    written_at = facts.table.snapshot_commit_time_ms(2)
    assert written_at is not None
    progress = facts.progress({0: 2, 1: 7}, now=now)
    assert progress[1].data_loss.why == "caught up"
    # A shard reading its one new snapshot is not at risk (nor costs a read).
    assert facts.progress({0: 6, 1: 6}, now=now)[0].data_loss.why == "caught up"
    # No consumer file: snapshot 2 (4 newer, > min 2) expires 10 min after its commit.
    at_risk = progress[0].data_loss
    assert at_risk.why == "at risk" and at_risk.seconds is not None
    assert at_risk.seconds == pytest.approx(600 - (now - written_at / 1000), abs=2)
    # The shard's consumer file at 2 protects it for the hour it lives.
    ConsumerMirror(table.table.file_io, table.table_path, "g").write(0, 2, force=True)
    protected = facts.progress({0: 2, 1: 7}, now=now)[0].data_loss
    assert protected.seconds == pytest.approx(3600, abs=5)
    # A file ahead of the position protects nothing.
    ConsumerMirror(table.table.file_io, table.table_path, "g").write(0, 4, force=True)
    assert facts.progress({0: 2, 1: 7}, now=now)[0].data_loss.seconds == \
        pytest.approx(at_risk.seconds, abs=1)
