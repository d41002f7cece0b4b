"""Upgrades: today's code reads what the release of 2026-11 wrote (issue 35, "Upgrades"): a
master's checkpoint and WAL tail and two data nodes' LevelDB stores, kept in
``tests/fixtures/release-2026-11`` (made by ``tests/fixtures/make_upgrade_fixture.py``).

What that release did: queue ``orders`` created (max_attempts 2, dead letters to
``orders.failed``, lease 30 s); six items at priority 5, ``urgent`` (acked), ``later`` (delayed
364 days), ``keyed-1`` (key ``k``, leased for 12 hours, the longest lease, still leased); the
first order nacked with an error; queue ``logs`` with three items, then a checkpoint, then
three more (the tail). Time runs on: a test run more than 12 hours after the fixture was
written (``written_at``) finds the lease run out and ``keyed-1`` ready again, as a master
restarted that late would.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from blizzard.client.core import Client
from blizzard.local.harness import LocalCluster
from blizzard.net import keys as k

pytestmark = pytest.mark.cluster

FIXTURE = Path(__file__).parent / "fixtures" / "release-2026-11"
LEASE_S, DELAY_S = 12 * 3600.0, 364 * 86400.0  # as ``fixtures/make_upgrade_fixture.py``


def test_a_cluster_written_by_the_release_of_2026_11_starts_and_serves_it(tmp_path, monkeypatch):
    base = tmp_path / "cluster"
    shutil.copytree(FIXTURE, base)
    monkeypatch.delenv(k.ENV, raising=False)  # the fixture is insecure
    cluster = LocalCluster(str(base), datanodes=2, replication=2, heartbeat_s=0.2,
                           dead_after_s=5, keys=None).start()
    age = time.time() - float((FIXTURE / "written_at").read_text())
    leased, delayed = age < LEASE_S - 60, age < DELAY_S - 60  # (a minute's margin: no race)
    try:
        with Client(cluster.master_addr, timeout_s=30) as c:
            assert {key: c.stats("orders")[key] for key in ("ready", "delayed", "leased")} == \
                {"ready": 6 + (not leased) + (not delayed), "delayed": int(delayed),
                 "leased": int(leased)}
            config = c.queue_config("orders")
            assert (config["max_attempts"], config["dead_letter"], config["lease_s"]) == \
                (2, "orders.failed", 30.0)
            taken = c.dequeue_many("orders", 10)
            back = sorted(m.data for m in taken if not m.data.startswith(b"order-"))
            assert back == [b"keyed-1"] * (not leased) + [b"later"] * (not delayed)
            orders = [m for m in taken if m.data.startswith(b"order-")]
            assert sorted(m.data for m in orders) == [b"order-%d" % i for i in range(6)]
            assert all(m.priority == 5 for m in orders)
            nacked = [m for m in orders if m.attempts]  # delivered once before, and nacked
            assert [(m.data, m.attempts, m.error) for m in nacked] == \
                [(b"order-0", 1, "ValueError: bad order")]
            c.ack_many(taken)
            logs = c.dequeue_many("logs", 10)
            assert [m.data for m in logs] == [bytes(range(256)) * 4, b"", b"tail"] + \
                [b"after-checkpoint-%d" % i for i in range(3)]
            c.ack_many(logs)
            assert c.stats("orders")["leased"] == int(leased)  # keyed-1, while its lease lasts
    finally:
        cluster.stop()
