"""Sharding's parts without a cluster: id ranges, key routing, merged counters, the heads a
client keeps, and a master's heads (asked, told with a lease, published) in process."""

from __future__ import annotations

import time

import pytest
import zmq

from blizzard.client.sharded.admin import (
    merge_queues,
    merge_stats,
    merge_status,
    shard_settings,
    whole_settings,
)
from blizzard.client.sharded.client import key_shard, split_shards
from blizzard.client.sharded.view import STALE_S, HeadsView
from blizzard.local.harness import free_port
from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument
from blizzard.wire.shard_messages import first_id, shard_of, topic
from master.shard.heads import claim_shard
from master.state.machine import State
from master.state.queue_config import QueueConfig

from support.in_process_master import alloc, call, in_process_master
from support.wait import wait_for


def test_an_id_names_its_shard_and_shard_0_keeps_the_unsharded_ids():
    assert first_id(0) == 1 and shard_of(1) == 0
    assert shard_of(first_id(5)) == 5 and shard_of(first_id(6) - 1) == 5
    assert shard_of(p.MAX_ID) == 127


def test_a_fresh_master_starts_at_its_shard_and_refuses_another_shards_log():
    state = State()
    claim_shard(state, 3)
    assert state.id_hi == first_id(3)
    claim_shard(state, 3)  # again, as after a restart
    with pytest.raises(InvalidArgument, match="shard 3, not of shard 4"):
        claim_shard(state, 4)


def test_keys_map_to_one_shard_each_and_spread():
    assert key_shard("user-7", 8) == key_shard("user-7", 8)
    spread = {key_shard(f"user-{i}", 8) for i in range(200)}
    assert spread == set(range(8))
    assert split_shards("tcp://127.0.0.1:1,tcp://127.0.0.1:2  tcp://127.0.0.1:3") == \
        ["tcp://127.0.0.1:1,tcp://127.0.0.1:2", "tcp://127.0.0.1:3"]
    with pytest.raises(InvalidArgument):
        split_shards([])


def test_topics_do_not_match_a_longer_queue_name():
    assert not topic("jobs.dead").startswith(topic("jobs"))


def stats(queue, ready, age):
    return {"queue": queue, "ready": ready, "delayed": 1, "leased": 2, "pending": 0, "dead": 0,
            "oldest_age_s": age}


def test_counters_add_up_over_shards():
    merged = merge_stats([stats("q", 3, 1.5), stats("q", 4, 9.0)])
    assert merged["ready"] == 7 and merged["delayed"] == 2 and merged["oldest_age_s"] == 9.0
    listing = merge_queues([[stats("a", 1, 0.0)], [stats("a", 2, 0.0), stats("b", 5, 0.0)]])
    assert [(q["queue"], q["ready"]) for q in listing] == [("a", 3), ("b", 5)]


def test_statuses_merge_nodes_and_queues():
    q = p.QueueStats("q", 1, 0, 0, 0, 0, 2.0, 5, 4, p.QueueSettings(**QueueConfig().as_dict()))
    node = p.NodeStatus("dn", "tcp://127.0.0.1:1", True, 0.1, 1, 10, 100)
    one = p.ClusterStatus([node], [q], 0, 2, True, False, "aaaa", 0, "")
    two = p.ClusterStatus([node], [q], 3, 2, True, True, "bbbb", 1, "tcp://127.0.0.1:9")
    merged = merge_status([one, two])
    assert len(merged.nodes) == 2 and merged.queues[0].ready == 2
    assert merged.queues[0].enqueued_total == 10 and merged.under_replicated == 3
    assert merged.safe_mode and merged.cluster_id == "aaaa,bbbb" and merged.epoch == 1


def test_a_rate_limit_is_split_between_shards_and_shown_whole():
    part = shard_settings({"rate_per_s": 30.0, "burst": 7, "lease_s": 5.0}, 3)
    assert part == {"rate_per_s": 10.0, "burst": 3, "lease_s": 5.0}
    assert whole_settings(part, 3)["rate_per_s"] == 30.0


def head(shard, ready, priority, at=0.0, seq=0):
    return p.QueueHead("q", shard, ready, priority, at, seq)


def test_the_view_picks_the_best_fresh_head_and_keeps_the_newest():
    view = HeadsView()
    view.learn(head(0, 5, 40, seq=10))
    view.learn(head(1, 5, 30, at=2.0, seq=10))
    view.learn(head(2, 0, 0, seq=10))  # empty: never chosen
    assert view.best("q") == 1 and view.best("q", [0, 2]) == 0
    view.learn(head(1, 5, 30, at=1.0, seq=10))  # equal priority: the earlier enqueue first
    view.learn(head(0, 5, 30, at=1.5, seq=11))
    assert view.best("q") == 1
    view.learn(head(1, 5, 99, seq=9))  # older than what is known: ignored
    assert view.fresh("q")[1].priority == 30
    view.emptied("q", 1)
    assert view.best("q") == 0
    view.learn(head(0, 5, 30), time.monotonic() - STALE_S - 1)  # no news for long: untrusted
    view.heads["q"][0] = (head(0, 5, 30), time.monotonic() - STALE_S - 1)
    assert view.best("q") is None and not view.knows("q", 3)


def test_a_master_tells_its_head_when_asked_and_after_a_lease():
    master = in_process_master(replication=1, shard=2)
    try:
        placement = alloc(master, 3, priorities=[5, 1, 9])
        assert shard_of(placement.first) == 2
        call(master, p.Commit(placement.ids, ["dn-a"], "c1"))
        assert call(master, p.Head("q")) == \
            p.QueueHead("q", 2, 3, 1, pytest.approx(time.time(), abs=5), master.heads.seq())
        leased = call(master, p.Lease("q", 1, 30.0, 0.0, "l1", [], [], True))
        assert leased.head_ready == 2 and leased.head_priority == 5
        assert leased.head_seq > 0
        plain = call(master, p.Lease("q", 1, 30.0, 0.0, "l2", [], []))
        assert plain.head_ready == -1  # not asked: not computed
        assert call(master, p.Head("nothing")).ready == 0
    finally:
        master.close()


def test_a_master_publishes_its_heads_as_they_change():
    port = free_port()
    master = in_process_master(replication=1, heads_bind=f"tcp://127.0.0.1:{port}")
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, topic("q"))
    sub.connect(f"tcp://127.0.0.1:{port}")
    try:
        heads = []
        deadline = time.monotonic() + 10
        while not heads and time.monotonic() < deadline:  # until the subscription is through
            master.heads.next_all = 0.0  # republish everything, as once a second
            placement = alloc(master, 1, priorities=[4])
            call(master, p.Commit(placement.ids, ["dn-a"], f"c{placement.first}"))
            master.run_once(0)
            if sub.poll(100):
                heads.append(p.unpack(sub.recv_multipart()[1]))
        assert heads and heads[0].queue == "q" and heads[0].priority == 4 and heads[0].ready >= 1
    finally:
        sub.close()
        master.close()


def test_a_master_publishes_only_what_someone_listens_to_and_tells_a_newcomer_at_once():
    port = free_port()
    master = in_process_master(replication=1, heads_bind=f"tcp://127.0.0.1:{port}")
    sent: list[str] = []
    send = master.heads._send
    master.heads._send = lambda head: (sent.append(head.queue), send(head))
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    try:
        for queue in ("q", "other"):
            placement = alloc(master, 2, queue=queue, priorities=[3, 6])
            call(master, p.Commit(placement.ids, ["dn-a"], f"c{queue}"))
        master.heads.next_all = 0.0  # the once-a-second round too: still nothing to send
        master.run_once(0)
        assert sent == [] and not master.heads.listened
        sub.setsockopt(zmq.SUBSCRIBE, topic("q"))
        sub.connect(f"tcp://127.0.0.1:{port}")
        deadline = time.monotonic() + 10
        while not sub.poll(20) and time.monotonic() < deadline:
            master.run_once(0)  # reads the subscription: the head goes out with no change
        head = p.unpack(sub.recv_multipart()[1])
        assert (head.queue, head.ready, head.priority) == ("q", 2, 3)
        master.heads.next_all = 0.0
        master.run_once(0)
        assert set(sent) == {"q"}  # "other" has no subscriber
        sub.close()
        wait_for(lambda: master.run_once(0) or not master.heads.listened,
                 what="the last subscriber's leaving noticed")
    finally:
        sub.close()
        master.close()
