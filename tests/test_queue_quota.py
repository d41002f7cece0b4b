"""Who may create queues on a secure cluster, with which settings, and listing many of them
(issue 32, items 6 and 7): a client key's quota leaves admins headroom, listings page, and
settings beyond the policy need an admin key."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from blizzard.client.core import Client
from blizzard.net.transport import call, call_many
from blizzard.wire import protocol as p
from blizzard.wire.errors import Forbidden, InvalidArgument, TooManyQueues
from blizzard.wire.queue_settings import NAMES

BLIZZARD = [sys.executable, "-m", "blizzard.cli"]


def cli(master: str, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([*BLIZZARD, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "BLIZZARD_MASTER": master})
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stdout}{proc.stderr}"
    return proc


def create_many(cluster, names: list[str], key: str = "admin") -> None:
    """Create queues with ``key``, many requests in flight at once."""
    ep = cluster.endpoint(cluster.master_addr, key)
    try:
        unset = dict.fromkeys(NAMES)
        for start in range(0, len(names), 500):
            replies = call_many([(ep, p.Configure(name, True, **unset))
                                 for name in names[start:start + 500]], 30)
            assert all(isinstance(r, p.QueueStats) for r in replies), replies[:3]
    finally:
        ep.close()


def test_a_client_key_meets_its_queue_quota_and_an_admin_keeps_headroom(cluster_factory):
    cluster = cluster_factory(datanodes=1, replication=1, heartbeat_s=0.2, dead_after_s=1.5)
    quota = 1000  # the master's default --client-queues
    create_many(cluster, [f"c{i:04}" for i in range(quota - 1)], key="client")  # a flood
    with Client(cluster.master_addr, timeout_s=10) as c, \
            Client(cluster.master_addr, timeout_s=10, admin=True) as admin:
        c.enqueue("last", b"x")  # enqueueing to a new name creates it too
        with pytest.raises(TooManyQueues, match=f"fewer than {quota}"):
            c.create_queue("one-more")
        with pytest.raises(TooManyQueues, match="client key"):
            c.enqueue("one-more", b"x")
        c.enqueue("last", b"y")  # the queues it has still take items
        admin.create_queue("ops")  # the admins' headroom
        # an admin lists page by page (a reply holds at most MAX_QUEUE_PAGE) and deletes
        ep = cluster.endpoint(cluster.master_addr, "admin")
        try:
            first = call(ep, p.ListQueues("", 3), 5)
            assert [q.queue for q in first.queues] == ["c0000", "c0001", "c0002"]
            assert first.more == quota + 1 - 3
            rest = call(ep, p.ListQueues("c0997", 0), 5)
            assert [q.queue for q in rest.queues] == ["c0998", "last", "ops"] and rest.more == 0
            with pytest.raises(InvalidArgument):
                call(ep, p.ListQueues("", -1), 5)
        finally:
            ep.close()
        assert len(admin.queues()) == quota + 1
    cluster.master.kill()
    cluster.restart_master()  # the queues are the WAL's: so is the quota
    with Client(cluster.master_addr, timeout_s=10) as c, \
            Client(cluster.master_addr, timeout_s=10, admin=True) as admin:
        with pytest.raises(TooManyQueues):
            c.create_queue("one-more")
        admin.delete_queue("c0000")
        admin.delete_queue("ops")
        c.create_queue("one-more")  # below the client quota again


def test_an_admin_key_meets_max_queues(cluster_factory):
    cluster = cluster_factory(datanodes=1, replication=1, heartbeat_s=0.2, dead_after_s=1.5,
                              master_args=["--client-queues", "2", "--max-queues", "3"])
    with Client(cluster.master_addr, timeout_s=10, admin=True) as admin:
        for name in ("a", "b", "c"):
            admin.create_queue(name)
        with pytest.raises(TooManyQueues, match="max-queues"):
            admin.create_queue("d")


def test_status_and_queue_list_work_with_ten_thousand_queues(cluster_factory):
    cluster = cluster_factory(datanodes=1, replication=1, heartbeat_s=0.2, dead_after_s=1.5)
    n = 9_999  # one reply listing them all is more than the client decodes
    create_many(cluster, [f"q{i:04}" for i in range(n)])
    status = json.loads(cli(cluster.master_addr, "status", "--json").stdout)
    assert len(status["queues"]) == p.MAX_QUEUE_PAGE
    assert status["queues_more"] == n - p.MAX_QUEUE_PAGE
    text = cli(cluster.master_addr, "status").stdout
    assert f"... and {n - p.MAX_QUEUE_PAGE} more queues" in text
    listed = json.loads(cli(cluster.master_addr, "queue", "list", "--json").stdout)
    assert [q["queue"] for q in listed["queues"]] == [f"q{i:04}" for i in range(n)]


def test_a_client_key_creates_queues_only_with_the_settings_the_policy_allows(cluster_factory):
    cluster = cluster_factory(datanodes=1, replication=1, heartbeat_s=0.2, dead_after_s=1.5)
    with Client(cluster.master_addr, timeout_s=10) as c:
        for hostile in [{"dead_letter": "attacker-reads"}, {"rate_per_s": 0.001},
                        {"burst": 1, "max_attempts": 1}]:
            with pytest.raises(Forbidden, match="admin key"):
                c.create_queue("emails", **hostile)
        assert c.queues() == []  # nothing was created
        # what @task names by default: its own retries
        settings = c.create_queue("work", max_attempts=3, backoff_base_s=0.4)
        assert settings["max_attempts"] == 3
        c.create_queue("plain", dead_letter="")  # a default value is no setting
    with Client(cluster.master_addr, timeout_s=10, admin=True) as admin:
        admin.create_queue("emails", dead_letter="emails-dlq", max_attempts=1)
        assert admin.queue_config("emails")["dead_letter"] == "emails-dlq"


@pytest.mark.parametrize("policy, allowed", [("", False), ("all", True)])
def test_the_settings_policy_is_the_masters_option(cluster_factory, policy, allowed):
    cluster = cluster_factory(datanodes=1, replication=1, heartbeat_s=0.2, dead_after_s=1.5,
                              master_args=["--client-settings", policy])
    with Client(cluster.master_addr, timeout_s=10) as c:
        if allowed:
            assert c.create_queue("q", dead_letter="elsewhere")["dead_letter"] == "elsewhere"
        else:
            with pytest.raises(Forbidden, match=r"may set: none"):
                c.create_queue("q", max_attempts=3)
            c.create_queue("q")
