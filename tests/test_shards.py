"""A sharded queue on real processes: three shards, each a master with its own data node."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from blizzard import Client
from blizzard.client.sharded.client import key_shard
from blizzard.client.sharded.view import HeadsFeed, HeadsView
from blizzard.local.shard_cluster import ShardedCluster
from blizzard.net.keys import ClientKeys
from blizzard.net.secure import HandshakeWatch
from blizzard.wire import protocol as p
from blizzard.wire.errors import ClientClosed, InvalidArgument, LeaseExpired, QueueExists
from blizzard.wire.shard_messages import first_id, shard_of

from support.processes import pids_with
from support.wait import wait_for

pytestmark = pytest.mark.cluster  # real processes, some started here


def priorities_served(client, queue: str, n: int) -> list[int]:
    served = []
    for _ in range(n):
        msg = client.dequeue(queue)
        assert msg is not None
        served.append(msg.priority)
        msg.ack()
    return served


@pytest.mark.parametrize("options", [{"heads": True}, {"heads": False, "peeks": 3}],
                         ids=["published-heads", "peek-all"])
def test_items_spread_over_shards_and_come_back_in_priority_order(sharded, options):
    rng = random.Random(5)
    prios = [rng.randrange(1000) for _ in range(60)]
    with sharded.client() as producer:
        ids = [producer.enqueue("jobs", b"%d" % i, priority=pr) for i, pr in enumerate(prios)]
    assert {shard_of(i) for i in ids} == {0, 1, 2}  # random shards: all three get some
    assert all(i >= first_id(shard_of(i)) for i in ids) and len(set(ids)) == len(ids)
    with sharded.client(**options) as consumer:
        # one consumer and no producer: what it knows is exact, so the order is strict
        assert priorities_served(consumer, "jobs", 60) == sorted(prios)
        assert consumer.dequeue("jobs") is None
        assert consumer.stats("jobs")["ready"] == 0


def test_peek_one_asks_one_shard_and_relaxes_the_order(sharded):
    with sharded.client() as producer:
        for i in range(30):
            producer.enqueue("jobs", b"x", priority=i)
    with sharded.client(heads=False, peeks=1) as consumer:
        served = priorities_served(consumer, "jobs", 30)
        assert sorted(served) == list(range(30))
        # one Head and one Lease per pop, and a few more when a sampled shard ran empty
        assert 60 <= consumer.picker.requests <= 60 + 3 * 10
    c = sharded.client()
    c.enqueue("jobs", b"late")
    msg = c.dequeue("jobs")
    c.close()  # a closed sharded client: every shard's part refuses
    with pytest.raises(ClientClosed):
        c.enqueue("jobs", b"x")
    with pytest.raises(ClientClosed):
        c.dequeue("jobs")
    with pytest.raises(ClientClosed):
        msg.ack()
    c.close()  # a second close does nothing


def test_counters_add_up_and_settings_apply_to_every_shard(sharded):
    with sharded.client(admin=True) as c:
        settings = c.create_queue("limited", rate_per_s=30.0, burst=6, max_attempts=2)
        assert settings["rate_per_s"] == pytest.approx(30.0) and settings["burst"] == 6
        for shard in c.shards:  # each shard admits its share
            assert shard.queue_config("limited")["rate_per_s"] == pytest.approx(10.0)
        with pytest.raises(QueueExists):
            c.create_queue("limited")
        c.enqueue_many("limited", [b"a"] * 9, key=None)
        c.enqueue_many("other", [b"b"] * 5)
        assert c.stats("limited")["ready"] == 9
        names = {q["queue"]: q["ready"] for q in c.queues()}
        assert names["limited"] == 9 and names["other"] == 5
        st = c.status()
        assert len(st.nodes) == 3 and len(st.cluster_id.split(",")) == 3
        assert c.purge("other") == 5 and c.stats("other")["ready"] == 0


def test_key_exclusivity_holds_across_shards(sharded):
    keys = [f"user-{i}" for i in range(12)]
    with sharded.client() as producer:
        by_key = {key: producer.enqueue_many("jobs", [b"1", b"2", b"3"], key=key)
                  for key in keys}
    for key, ids in by_key.items():  # a key's items share its shard
        assert {shard_of(i) for i in ids} == {key_shard(key, 3)}
    assert len({shard_of(ids[0]) for ids in by_key.values()}) > 1
    with sharded.client() as a, sharded.client() as b:
        first = [m for _ in range(3) for m in a.dequeue_many("jobs", 100)]
        assert sorted(m.key for m in first) == sorted(keys)  # one item per key at a time
        assert b.dequeue_many("jobs", 100) == []  # every key is held by a
        a.ack_many(first)
        second = [m for _ in range(3) for m in b.dequeue_many("jobs", 100)]
        assert sorted(m.key for m in second) == sorted(keys)
        b.ack_many(second)


def test_acks_nacks_and_deletes_go_to_each_items_shard(sharded):
    with sharded.client(admin=True) as c:
        ids = c.enqueue_many("jobs", [b"a"] * 4) + c.enqueue_many("jobs", [b"b"] * 4) + \
            c.enqueue_many("jobs", [b"c"] * 4)
        msgs = []
        while len(msgs) < 12:
            msgs += c.dequeue_many("jobs", 12)
        assert sorted(m.id for m in msgs) == sorted(ids)
        c.nack_many(msgs[:3], delay_s=0.0)
        c.ack_ids([m.id for m in msgs[3:]], [m.lease for m in msgs[3:]])
        assert c.stats("jobs")["ready"] == 3 and c.stats("jobs")["leased"] == 0
        for m in msgs[:3]:
            c.delete("jobs", m.id)
        assert c.stats("jobs")["ready"] == 0


def test_a_client_listing_the_shards_out_of_order_is_refused(sharded):
    with Client(list(reversed(sharded.addrs)), timeout_s=5) as c:
        with pytest.raises(InvalidArgument, match="shard order"):
            for _ in range(10):  # a random shard: some are in their place
                c.enqueue("jobs", b"x")


def test_producers_and_stagers_spread_batches_and_keep_ids_in_order(sharded):
    with sharded.client() as c:
        with c.producer("jobs", window=2) as prod:
            for i in range(9):
                prod.send([b"%d-%d" % (i, j) for j in range(5)])
            ids = prod.flush()
        assert len(ids) == 45 and {shard_of(i) for i in ids} == {0, 1, 2}
        stager = c.stager("staged")
        for _ in range(6):
            stager.send([b"s"] * 3)
        staged = stager.flush()
        assert c.stats("staged")["ready"] == 0
        c.commit(staged)
        assert c.stats("staged")["ready"] == 18


def test_kill_9_of_one_shard_master_under_load_loses_nothing(sharded):
    acked_enqueues: list[int] = []
    consumed: set[int] = set()
    stop = threading.Event()
    errors: list[BaseException] = []

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with sharded.client(timeout_s=30) as c:
                for _ in range(60):  # bounded
                    if stop.is_set():
                        break
                    acked_enqueues.extend(c.enqueue_many("load", [b"p"] * 5,
                                                         priority=rng.randrange(10)))
        except BaseException as exc:
            errors.append(exc)

    def consume() -> None:
        try:
            with sharded.client(timeout_s=30) as c:
                while not stop.is_set():
                    msgs = c.dequeue_many("load", 20, wait_s=0.2)
                    consumed.update(m.id for m in msgs)
                    try:
                        c.ack_many(msgs)
                    except LeaseExpired:  # leased from shard 1 just before its kill: a lease
                        pass  # is answered before its fsync, so those items come again
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(s,)) for s in range(2)] + \
        [threading.Thread(target=consume)]
    for t in threads:
        t.start()
    wait_for(lambda: len(consumed) >= 100 or errors, 30, "the first items consumed")
    sharded.kill_master(1)
    # the other two shards keep serving while shard 1 is down, without waiting on it
    with sharded.client(timeout_s=30) as other:
        started = time.monotonic()
        for _ in range(20):
            other.enqueue("elsewhere", b"x")
        got = []
        while len(got) < 20 and time.monotonic() - started < 20:
            got += other.dequeue_many("elsewhere", 20)
        assert len(got) == 20 and {shard_of(m.id) for m in got} <= {0, 2}
        other.ack_many(got)
        assert time.monotonic() - started < 15
    with sharded.client(timeout_s=2) as quick:  # status shows the shards that answer
        st = quick.status()
        assert list(quick.unanswered) == [1] and "MasterUnavailable" in quick.unanswered[1]
        assert "load" in {q.queue for q in st.queues}
    sharded.restart_master(1)
    for t in threads[:2]:
        t.join(90)
    wait_for(lambda: set(acked_enqueues) <= consumed or errors, 60, "every acked item consumed")
    stop.set()
    threads[2].join(30)
    assert not errors, errors
    assert set(acked_enqueues) <= consumed
    assert {shard_of(i) for i in consumed} == {0, 1, 2}


def test_a_master_refuses_the_data_dir_of_another_shard(sharded, tmp_path):
    with sharded.client() as c:
        c.enqueue_many("jobs", [b"x"] * 10, key="on-shard-0" if key_shard("on-shard-0", 3) == 0
                       else next(f"k{i}" for i in range(100) if key_shard(f"k{i}", 3) == 0))
    shard = sharded.shards[0]
    shard.master.stop()
    data_dir = os.path.join(shard.base_dir, "master")
    out = subprocess.run([sys.executable, "-m", "master", "--data-dir", data_dir, "--insecure",
                          "--bind", "tcp://127.0.0.1:1", "--shard", "2"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "holds the ids of shard 0, not of shard 2" in out.stdout + out.stderr


def test_cluster_command_with_masters_restarts_a_dead_shard_master(tmp_path):
    from blizzard.local.harness import free_port

    port, node_port = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "blizzard.cli", "cluster", "--data-dir",
                             str(tmp_path), "--masters", "2", "--datanodes", "1",
                             "--replication", "1", "--port", str(port), "--node-port",
                             str(node_port), "--no-metrics"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")),
                              daemon=True)
    reader.start()
    try:
        wait_for(lambda: any("export BLIZZARD_MASTER=" in line for line in lines), 60,
                 "the sharded cluster to start")
        spec = next(line for line in lines if "export BLIZZARD_MASTER=" in line) \
            .split("=", 1)[1].strip().strip("'")
        assert len(spec.split()) == 2
        with Client(spec, timeout_s=30, keys=str(tmp_path / "keys")) as c:
            key = next(f"k{i}" for i in range(100) if key_shard(f"k{i}", 2) == 1)
            c.enqueue("q", b"before", key=key)
            (victim,) = pids_with(str(tmp_path / "shard1" / "master"))
            os.kill(victim, signal.SIGKILL)
            wait_for(lambda: any("shard 1: the master serves again" in line for line in lines),
                     60, "the shard master restarted")
            assert any("restarting it on its WAL" in line for line in lines)
            c.enqueue("q", b"after", key=key)
            first = c.dequeue_many("q", 10)
            assert [m.data for m in first] == [b"before"]  # one key: one item at a time
            c.ack_many(first)
            assert [m.data for m in c.dequeue_many("q", 10)] == [b"after"]
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        assert proc.returncode == 0, "".join(lines)
    finally:
        if proc.poll() is None:  # Ctrl-C first: it stops the cluster's processes too
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_acks_travel_beside_the_next_lease_and_report_lost_leases(sharded):
    with sharded.client() as c:
        c.enqueue_many("jobs", [b"a"] * 30)  # one random shard
        c.enqueue_many("jobs", [b"b"] * 30)
        with c.consume("jobs", 10, wait_s=0.2) as batches:
            seen = 0
            for batch in batches:
                seen += len(batch)
                if seen >= 60:
                    batches.stop()
        assert c.stats("jobs")["ready"] == 0 and c.stats("jobs")["leased"] == 0
        c.enqueue_many("jobs", [b"c"] * 3)
        msgs = c.dequeue_many("jobs", 3)
        c.nack_many(msgs, delay_s=0.0)  # settled: a later ack of them finds no lease
        with pytest.raises(LeaseExpired):
            c.dequeue_many("jobs", 3, ack=msgs)
        assert c.stats("jobs")["ready"] == 3  # what that call leased went straight back


def test_published_heads_reach_a_subscribed_client_and_one_address_finds_every_shard(sharded):
    with Client.discover(sharded.addrs[2], timeout_s=10) as consumer, \
            sharded.client() as producer:
        assert len(consumer.shards) == 3  # found from shard 2's own list
        producer.enqueue("q", b"first", priority=5)
        assert consumer.dequeue("q").data == b"first"  # subscribed to "q" from here on
        key = next(f"k{i}" for i in range(100) if key_shard(f"k{i}", 3) == 1)
        producer.enqueue("q", b"urgent", priority=-5, key=key)

        def published():
            consumer.feed.drain()
            head = consumer.view.fresh("q").get(1)
            return head is not None and head.priority == -5 and head.ready == 1
        wait_for(published, 10, "shard 1's new head, published")
        requests = consumer.picker.requests
        assert consumer.dequeue("q").data == b"urgent"
        assert consumer.picker.requests == requests + 1  # no question asked before the lease
        # the feed admits producers' and consumers' keys (and admins'), not a data node's
        heads = consumer.shards[1].master.call(p.Hello()).heads
        for name, refused in (("datanode", True), ("admin", False)):
            feed = HeadsFeed(consumer.ctx, HeadsView(), ClientKeys.from_dir(sharded.keys, name))
            watch = HandshakeWatch(feed.sock, heads, True)
            try:
                feed.connect(heads)
                feed.subscribe("q")
                if refused:
                    wait_for(watch.poll, 10, "the data node key's handshake refused")
                else:
                    wait_for(lambda feed=feed: feed.drain() > 0, 10, "the admin key's feed")
                    assert watch.poll() is None
            finally:
                watch.close()
                feed.close()


def test_after_a_shards_standby_takes_over_the_client_follows_its_heads(tmp_path):
    with ShardedCluster(str(tmp_path / "ha"), masters=2, datanodes=1, replication=1,
                        standby=True, heartbeat_s=0.2, dead_after_s=1.5) as cluster, \
            cluster.client(timeout_s=30) as c:
        key0 = next(f"k{i}" for i in range(100) if key_shard(f"k{i}", 2) == 0)
        c.enqueue("q", b"before", key=key0)
        first = c.dequeue("q")  # subscribed to shard 0's primary from here on
        assert first.data == b"before"
        first.ack(wait=True)  # else it holds the key
        shard0 = cluster.shards[0]
        old_heads = c.feed.connected.copy()
        shard0.master.kill()
        wait_for(lambda: shard0.find_primary() is shard0.master, 30, "the standby in charge")
        new_heads = shard0.welcome(shard0.master).heads
        assert new_heads not in old_heads
        c.enqueue("q", b"after", key=key0)  # to the new primary
        assert c.dequeue("q", wait_s=10).data == b"after"
        assert new_heads in c.feed.connected  # its heads feed joined
