"""Who may create queues on a secure cluster, with which settings, and listing many of them
(issue 32, items 6 and 7): a client key's quota leaves admins headroom, listings page, and
settings beyond the policy need an admin key."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from blizzard import protocol as p
from blizzard.client import Client
from blizzard.errors import Forbidden, TooManyQueues
from blizzard.queue_settings import NAMES
from blizzard.transport import call, call_many

BLIZZARD = [sys.executable, "-m", "blizzard.cli"]


def cli(master: str, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([*BLIZZARD, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "BLIZZARD_MASTER": master})
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stdout}{proc.stderr}"
    return proc


def create_many(cluster, names: list[str]) -> None:
    """Create queues with the admin key, many requests in flight at once."""
    ep = cluster.endpoint(cluster.master_addr, "admin")
    try:
        unset = dict.fromkeys(NAMES)
        for start in range(0, len(names), 500):
            replies = call_many([(ep, p.Configure(name, True, **unset))
                                 for name in names[start:start + 500]], 30)
            assert all(isinstance(r, p.QueueStats) for r in replies), replies[:3]
    finally:
        ep.close()


def test_a_client_key_meets_its_queue_quota_and_an_admin_keeps_headroom(cluster_factory):
    cluster = cluster_factory(datanodes=1, replication=1, heartbeat_s=0.2, dead_after_s=1.5,
                              master_args=["--client-queues", "4", "--max-queues", "7"])
    with Client(cluster.master_addr, timeout_s=10) as c, \
            Client(cluster.master_addr, timeout_s=10, admin=True) as admin:
        c.create_queue("c0")
        c.enqueue("c1", b"x")  # enqueueing to a new name creates it too
        c.create_queue("c2")
        c.create_queue("c3")
        with pytest.raises(TooManyQueues, match="client key"):
            c.create_queue("c4")
        with pytest.raises(TooManyQueues, match="client key"):
            c.enqueue("c4", b"x")
        c.enqueue("c1", b"y")  # the queues it has still take items
        for name in ("a0", "a1", "a2"):  # the admins' headroom
            admin.create_queue(name)
        with pytest.raises(TooManyQueues, match="max-queues"):
            admin.create_queue("a3")
        # an admin lists page by page and deletes
        ep = cluster.endpoint(cluster.master_addr, "admin")
        try:
            first = call(ep, p.ListQueues("", 3), 5)
            assert [q.queue for q in first.queues] == ["a0", "a1", "a2"] and first.more == 4
            rest = call(ep, p.ListQueues("a2", 100), 5)
            assert [q.queue for q in rest.queues] == ["c0", "c1", "c2", "c3"] and rest.more == 0
        finally:
            ep.close()
        assert [q["queue"] for q in admin.queues()] == ["a0", "a1", "a2", "c0", "c1", "c2", "c3"]
    cluster.master.kill()
    cluster.restart_master()  # the queues are the WAL's: so is the quota
    with Client(cluster.master_addr, timeout_s=10) as c, \
            Client(cluster.master_addr, timeout_s=10, admin=True) as admin:
        with pytest.raises(TooManyQueues, match="holds 7 queues"):
            c.create_queue("c4")
        for name in ("a0", "a1", "a2", "c3"):
            admin.delete_queue(name)
        c.create_queue("c4")  # below the client quota again


def test_status_and_queue_list_work_with_ten_thousand_queues(cluster_factory):
    cluster = cluster_factory(datanodes=1, replication=1, heartbeat_s=0.2, dead_after_s=1.5,
                              master_args=["--max-queues", "12000"])
    n = 10_500  # past what one reply could carry before (the client refused to decode it)
    create_many(cluster, [f"q{i:05}" for i in range(n)])
    status = json.loads(cli(cluster.master_addr, "status", "--json").stdout)
    assert len(status["queues"]) == p.MAX_QUEUE_PAGE
    assert status["queues_more"] == n - p.MAX_QUEUE_PAGE
    text = cli(cluster.master_addr, "status").stdout
    assert f"... and {n - p.MAX_QUEUE_PAGE} more queues" in text
    listed = json.loads(cli(cluster.master_addr, "queue", "list", "--json").stdout)
    assert [q["queue"] for q in listed["queues"]] == [f"q{i:05}" for i in range(n)]


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
