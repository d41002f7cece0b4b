"""``blizzard status|queue ...`` with --json and for people, against a real cluster."""

from __future__ import annotations

import json

from blizzard import Client

from support.cli import run


def test_status_and_queue_json_documents(cluster):
    m = cluster.master_addr
    run("enqueue", "jobs", "a", "b", master=m)
    status = json.loads(run("status", "--json", master=m).stdout)
    assert set(status) == {"cluster_id", "epoch", "standby", "secure", "safe_mode", "replication",
                           "under_replicated", "nodes", "queues", "queues_more"}
    assert status["secure"] is True and len(status["nodes"]) == 3 and status["queues_more"] == 0
    assert isinstance(status["safe_mode"], bool)
    (queued,) = status["queues"]
    assert (queued["queue"], queued["enqueued_total"], queued["acked_total"]) == ("jobs", 2, 0)
    assert set(status["nodes"][0]) == {"node_id", "addr", "alive", "suspect", "heartbeat_age_s",
                                       "items", "bytes_used", "free_bytes"}
    assert status["nodes"][0]["suspect"] is False
    jobs = json.loads(run("queue", "stats", "jobs", "--json", master=m).stdout)
    assert {k: jobs[k] for k in ("queue", "ready", "leased", "dead")} == \
        {"queue": "jobs", "ready": 2, "leased": 0, "dead": 0}
    assert 0 <= jobs["oldest_age_s"] < 60
    listed = json.loads(run("queue", "list", "--json", master=m).stdout)["queues"]
    assert [q["queue"] for q in listed] == ["jobs"] and listed[0]["ready"] == 2
    text = run("queue", "stats", "jobs", master=m).stdout.decode()
    assert "ready: 2" in text and " s\n" in text and "oldest age: " in text  # rounded, with unit
    age = text.split("oldest age: ")[1].split()[0]
    assert len(age.split(".")[-1]) <= 1  # 0.6 s, not 0.5903642177581787
    human = run("status", master=m).stdout.decode()
    assert "alive" in human and "jobs" in human and ("MiB" in human or "GiB" in human)
    assert "\nsafe mode: " in human


def test_dead_letter_triage_shows_error_key_and_no_age_when_empty(cluster):
    m = cluster.master_addr
    run("queue", "config", "work", "--max-attempts", "1", master=m)
    empty = json.loads(run("queue", "stats", "work.dead", "--json", master=m).stdout)
    assert empty["ready"] == 0 and empty["oldest_age_s"] is None
    assert "oldest age: -" in run("queue", "stats", "work.dead", master=m).stdout.decode()
    with Client(m) as c:
        c.enqueue("work", b"payload", key="k1")
        msg = c.dequeue("work")
        assert msg.key == "k1" and msg.error == ""
        msg.nack(delay_s=0, error="ValueError: bad input")
        # the API shows them too
        assert [(d.key, d.error) for d in Client(m, admin=True).peek("work.dead")] == \
            [("k1", "ValueError: bad input")]
    peeked = json.loads(run("queue", "peek", "work.dead", "--json", master=m).stdout)
    (item,) = peeked["items"]
    assert (item["key"], item["error"], item["data"], item["attempts"]) == \
        ("k1", "ValueError: bad input", "payload", 1)
    text = run("queue", "peek", "work.dead", master=m).stdout.decode()
    assert "key=k1\terror=ValueError: bad input\tdata=payload" in text
    assert text.startswith("id=")


def test_queue_config_prints_the_values_in_force(cluster):
    m = cluster.master_addr
    text = run("queue", "config", "cfg", master=m).stdout.decode()
    assert "dead_letter: cfg.dead\n" in text and "burst: - (no rate limit)" in text
    doc = json.loads(run("queue", "config", "cfg", "--rate-per-s", "2.5", "--json",
                         master=m).stdout)
    assert doc["queue"] == "cfg" and doc["burst"] == 3 and doc["dead_letter"] == "cfg.dead"
    again = run("queue", "create", "cfg", master=m, check=False)
    assert again.returncode == 1 and b"blizzard queue config cfg" in again.stderr
