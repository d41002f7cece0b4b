"""End to end through Client against real master and data node processes."""

from __future__ import annotations

import time

import msgpack
import pytest

from blizzard import Client
from blizzard.client.message import leased_items
from blizzard.local.harness import LOOPBACK, free_port
from blizzard.net.transport import call
from blizzard.wire import protocol as p
from blizzard.wire.errors import (
    ClientClosed,
    InvalidArgument,
    LeaseExpired,
    MasterUnavailable,
    PayloadTooLarge,
    ProtocolError,
    UnknownOp,
)

from support.sends import watch_sends
from support.wait import wait_for


def test_enqueue_dequeue_ack_round_trip(cluster):
    with Client(cluster.master_addr, timeout_s=5) as c:
        first = c.enqueue("jobs", b"payload")
        ids = c.enqueue_many("jobs", [b"a", b"b", b"c"])
        assert ids == sorted(ids) and first < ids[0]
        assert c.stats("jobs")["ready"] == 4
        msg = c.dequeue("jobs", lease_s=30.0)
        assert (msg.id, msg.data, msg.queue, msg.attempts) == (first, b"payload", "jobs", 0)
        msg.ack()
        with c.dequeue("jobs") as msg:
            assert msg.data == b"a"
        msgs = c.dequeue_many("jobs", 100)
        assert [m.data for m in msgs] == [b"b", b"c"]
        assert c.stats("jobs")["leased"] == 2
        c.ack_many(msgs)
        assert c.stats("jobs") == {"queue": "jobs", "ready": 0, "delayed": 0, "leased": 0,
                                   "pending": 0, "dead": 0, "oldest_age_s": 0.0}
        assert c.dequeue("jobs") is None


def test_a_closed_client_refuses_calls_and_opens_no_connection(cluster):
    c = Client(cluster.master_addr, timeout_s=5)
    c.enqueue("jobs", b"x")
    msg = c.dequeue("jobs", lease_s=30.0)
    c.close()
    with pytest.raises(ClientClosed):
        msg.ack()  # no ack sent: the item stays leased
    with pytest.raises(ClientClosed):
        msg.ack(wait=True)
    with pytest.raises(ClientClosed):
        c.enqueue("jobs", b"y")
    with pytest.raises(ClientClosed):
        c.stats("jobs")
    assert all(ep.sock is None for ep in c.master.endpoints.values())
    assert c.datanodes.endpoints == {}
    with Client(cluster.master_addr, timeout_s=5) as other:
        assert other.stats("jobs")["leased"] == 1 and other.stats("jobs")["ready"] == 0


def test_many_items_spread_over_nodes_and_come_back_in_order(cluster):
    payloads = [i.to_bytes(4, "big") * 64 for i in range(5000)]
    with Client(cluster.master_addr, timeout_s=10) as c:
        ids = c.enqueue_many("bulk", payloads)
        assert len(set(ids)) == 5000
        got = []
        while len(got) < 5000:
            msgs = c.dequeue_many("bulk", 700)
            assert msgs
            got += msgs
            c.ack_many(msgs)
        assert [m.data for m in got] == payloads
        st = wait_for(lambda: (s := c.status()) and all(n.items == 0 for n in s.nodes) and s,
                      what="blobs of acked items to be deleted")
        assert sum(1 for n in st.nodes if n.alive) == 3


def test_context_manager_gives_the_item_back_on_error(cluster):
    with Client(cluster.master_addr, timeout_s=5) as c:
        c.enqueue("jobs", b"fragile")
        with pytest.raises(RuntimeError):
            with c.dequeue("jobs") as msg:
                raise RuntimeError("consumer failed")
        again = c.dequeue("jobs")
        assert (again.id, again.attempts) == (msg.id, 1)


def test_acks_not_awaited_are_durable_once_the_client_closes(cluster):
    with Client(cluster.master_addr, timeout_s=5) as c:
        c.enqueue_many("quiet", [b"%d" % i for i in range(20)])
        for _ in range(20):
            c.dequeue("quiet", lease_s=60).ack()  # sent, no answer awaited
    cluster.master.kill()  # no clean shutdown: only what the WAL holds survives
    cluster.restart_master()
    with Client(cluster.master_addr, timeout_s=5) as c:
        stats = c.stats("quiet")
        assert (stats["ready"], stats["leased"]) == (0, 0)


def test_expired_lease_returns_the_item_with_one_more_attempt(cluster):
    with Client(cluster.master_addr, timeout_s=5) as c:
        c.enqueue("jobs", b"slow job")
        first = c.dequeue("jobs", lease_s=0.3)
        again = c.dequeue("jobs", lease_s=30, wait_s=5)
        assert again is not None and again.id == first.id and again.attempts == 1
        with pytest.raises(LeaseExpired):
            first.ack(wait=True)
        again.ack()


def test_long_poll_returns_when_an_item_arrives(cluster):
    with Client(cluster.master_addr, timeout_s=5) as consumer, \
            Client(cluster.master_addr, timeout_s=5) as producer:
        started = time.monotonic()
        assert consumer.dequeue("empty", wait_s=0.3) is None
        assert time.monotonic() - started >= 0.25
        import threading
        t = threading.Timer(0.3, lambda: producer.enqueue("late", b"here"))
        t.start()
        msg = consumer.dequeue("late", wait_s=10)
        t.join()
        assert msg is not None and msg.data == b"here"


def test_master_restart_keeps_every_committed_item_and_never_reuses_ids(cluster):
    with Client(cluster.master_addr, timeout_s=5) as c:
        ids = c.enqueue_many("durable", [b"%d" % i for i in range(300)])
        leased = c.dequeue_many("durable", 10, lease_s=300)
        c.ack_many(leased[:5])
    cluster.master.kill()
    cluster.restart_master()
    with Client(cluster.master_addr, timeout_s=5) as c:
        stats = c.stats("durable")
        assert (stats["ready"], stats["leased"]) == (290, 5)
        new = c.enqueue("durable", b"after restart")
        assert new > max(ids)
        got = c.dequeue_many("durable", 1000)
        assert [m.data for m in got] == [b"%d" % i for i in range(10, 300)] + [b"after restart"]
        c.ack_many(got)


def test_a_master_that_is_down_gives_a_clear_error_not_a_hang():
    addr = f"tcp://{LOOPBACK}:{free_port()}"
    with Client(addr, timeout_s=0.5) as c:
        started = time.monotonic()
        with pytest.raises(MasterUnavailable, match="nothing listens|did not answer"):
            c.enqueue("jobs", b"x")
        assert time.monotonic() - started < 3


def test_oversize_payload_is_refused_before_any_bytes_move(cluster_factory):
    cl = cluster_factory(datanodes=1, replication=1, master_args=["--max-item-bytes", "1000"])
    with Client(cl.master_addr, timeout_s=5) as c:
        with pytest.raises(PayloadTooLarge, match="1001 bytes"):
            c.enqueue("jobs", b"x" * 1001)
        c.enqueue("jobs", b"x" * 1000)
        assert c.stats("jobs")["ready"] == 1


def test_bad_arguments_get_clear_errors_and_change_nothing(cluster):
    with Client(cluster.master_addr, timeout_s=5) as c:
        c.enqueue("jobs", b"keep")
        with pytest.raises(InvalidArgument, match="lease_s"):
            c.dequeue("jobs", lease_s=-1)
        with pytest.raises(InvalidArgument, match="queue name"):
            c.enqueue("", b"x")
        with pytest.raises(InvalidArgument, match="priority"):
            c.enqueue("jobs", b"x", priority="high")
        with pytest.raises(TypeError, match="bytes"):
            c.enqueue("jobs", "text")
        assert c.stats("jobs")["ready"] == 1


@pytest.mark.parametrize("target", ["master", "datanode"])
def test_malformed_frames_get_error_replies_and_the_server_keeps_serving(cluster, target):
    addr = cluster.master_addr if target == "master" else cluster.nodes[0].addr
    raw = cluster.dealer(addr)
    try:
        unknown_op = bytes([0x93, p.VERSION, 5, 0x91, 0xCD, 0x27, 0x0F])  # [VERSION, 5, [9999]]
        for body in [b"\xc1not msgpack", unknown_op, bytes([0x91, p.VERSION])]:
            raw.send(body)
            assert raw.poll(5000), "no reply to a malformed frame"
            rid, reply = p.decode(raw.recv())
            assert isinstance(reply, p.Error) and reply.code in (ProtocolError.code, UnknownOp.code)
        raw.send(msgpack.packb([1, 22, 7]))  # a Status from a client of wire version 1
        assert raw.poll(5000)
        assert msgpack.unpackb(raw.recv())[:4] == [1, 1, 7, "version"]  # in the layout it reads
        raw.send_multipart([b"two", b"frames"])
        assert raw.poll(5000)
        assert isinstance(p.decode(raw.recv())[1], p.Error)
        ep = cluster.endpoint(addr, "client" if target == "master" else "datanode")
        with pytest.raises(InvalidArgument):  # a well-formed message this server does not serve
            call(ep, p.Get([1], None) if target == "master" else p.Status(), 5)
        with pytest.raises(InvalidArgument):
            call(ep, p.Put([1], [b"x"], [12345], [], 1, "", False, None) if target == "datanode"
                 else p.Commit([], [], ""), 5)
        ep.close()
    finally:
        raw.close()
    with Client(cluster.master_addr, timeout_s=5) as c:
        c.enqueue("still", b"alive")
        assert c.dequeue("still").data == b"alive"


def test_uncommitted_enqueue_expires_and_its_blobs_are_deleted(cluster_factory):
    cl = cluster_factory(datanodes=1, replication=1, heartbeat_s=0.2, dead_after_s=1.5,
                         master_args=["--pending-timeout-s", "0.5"])
    master = cl.endpoint(cl.master_addr)
    placement = call(master, p.Place(1, []), 5)
    node = cl.endpoint(placement.nodes[0].addr)
    node.send(p.Put(placement.ids, [b"abc"], [0x352441C2], [], 1, "", True,
                    placement.grant))
    with Client(cl.master_addr, timeout_s=5) as c:
        wait_for(lambda: c.status().nodes[0].items == 1, what="the blob to be counted")
        wait_for(lambda: c.status().nodes[0].items == 0, what="the orphan blob to be deleted")
        assert c.stats("jobs")["ready"] == 0
    from blizzard.wire.errors import UnknownItem
    with pytest.raises(UnknownItem):
        call(master, p.Enqueue("jobs", placement.ids, [3], [0x352441C2], [0], [0.0], [""], False,
                               "e1", False, 1.0, placement.grant), 5)
    master.close()
    node.close()


def test_consume_acks_each_batch_with_the_next_lease(cluster):
    with Client(cluster.master_addr, timeout_s=5) as c:
        c.enqueue_many("stream", [b"%d" % i for i in range(250)])
        seen = []
        with c.consume("stream", 100, wait_s=0.2) as batches:
            for msgs in batches:
                seen += [m.data for m in msgs]
                if len(seen) == 250:
                    break
        assert seen == [b"%d" % i for i in range(250)]
        assert c.stats("stream")["ready"] == 0 and c.stats("stream")["leased"] == 0


def test_consume_gives_the_batch_back_when_the_body_fails(cluster):
    with Client(cluster.master_addr, timeout_s=5) as c:
        c.enqueue_many("stream", [b"a", b"b"])
        with pytest.raises(RuntimeError):
            with c.consume("stream", 10) as batches:
                for _msgs in batches:
                    raise RuntimeError("worker crashed")
        again = c.dequeue_many("stream", 10)
        assert [(m.data, m.attempts) for m in again] == [(b"a", 1), (b"b", 1)]


def test_extend_keeps_a_long_job_leased(cluster):
    with Client(cluster.master_addr, timeout_s=5) as c:
        c.enqueue("jobs", b"long")
        msg = c.dequeue("jobs", lease_s=0.5)
        msg.extend(30)
        time.sleep(0.8)  # past the original lease: the item must not be handed out again
        assert c.dequeue("jobs") is None
        msg.ack()


def test_staged_items_are_invisible_until_committed(cluster):
    with Client(cluster.master_addr, timeout_s=5) as c:
        staged = c.stage("jobs", [b"x", b"y"])
        assert c.stats("jobs")["ready"] == 0 and c.stats("jobs")["pending"] == 2
        c.commit(staged)
        c.commit(staged)  # idempotent
        assert c.stats("jobs")["ready"] == 2


def test_producer_pipelines_batches_and_returns_ids_in_order(cluster):
    with Client(cluster.master_addr, timeout_s=10) as c:
        with c.producer("pp", window=3) as prod:
            for i in range(20):
                prod.send([b"%d-%d" % (i, j) for j in range(50)])
            ids = prod.flush()
        assert len(ids) == len(set(ids)) == 1000
        got = []
        while msgs := c.dequeue_many("pp", 1000):
            got += msgs
            c.ack_many(msgs)
        assert sorted(m.data for m in got) == sorted(b"%d-%d" % (i, j) for i in range(20)
                                                       for j in range(50))
        assert sorted(m.id for m in got) == sorted(ids)


def test_producer_survives_a_data_node_dying(cluster):
    with Client(cluster.master_addr, timeout_s=10) as c:
        with c.producer("pd", window=4) as prod:
            for i in range(10):
                if i == 3:
                    cluster.nodes[0].kill()
                prod.send([b"%d" % i] * 20)
            ids = prod.flush()
        assert len(ids) == 200
        assert c.stats("pd")["ready"] == 200


def test_a_dead_data_node_costs_a_producer_one_stall_not_one_per_call(cluster_factory):
    # The master is slow to notice the death here, so only the client's memory avoids the node.
    cluster = cluster_factory(datanodes=3, replication=2, heartbeat_s=0.2, dead_after_s=60)
    dead = next(n.node_id for n in cluster.status().nodes if n.addr == cluster.nodes[0].addr)
    cluster.nodes[0].kill()
    with Client(cluster.master_addr, timeout_s=30) as c:
        placed: list[set[str]] = []
        put_reported = c.datanodes.put_reported

        def recording(nodes, grant, ids, blobs, crcs, meta):
            placed.append({n.node_id for n in nodes})
            return put_reported(nodes, grant, ids, blobs, crcs, meta)
        c.datanodes.put_reported = recording
        for i in range(6):  # round-robin placement puts the dead node in the first few
            c.enqueue_many("dn", [b"%d" % i] * 100)  # a placement of its own each time
        assert dead in c.suspected()
        assert sum(dead in nodes for nodes in placed) == 1  # placed there once, then avoided
        assert c.stats("dn")["ready"] == 600
        assert len(c.dequeue_many("dn", 600)) == 600


def test_a_dead_replica_costs_a_consumer_one_timeout_not_one_per_read(cluster_factory,
                                                                       monkeypatch):
    cluster = cluster_factory(datanodes=3, replication=2, heartbeat_s=0.2, dead_after_s=60)
    with Client(cluster.master_addr, timeout_s=30, node_timeout_s=1) as c:
        for i in range(6):  # a placement of its own each time, so node 0 holds some
            c.enqueue_many("dr", [b"%d" % i] * 100)
        # the node read first for the head item (replicas are listed as they reported)
        admin = cluster.endpoint(cluster.master_addr, "admin")
        (head,) = leased_items(call(admin, p.Peek("dr", 1), 5))
        admin.close()
        victim = next(n for n in cluster.nodes if n.addr == head.nodes[0].addr)
        victim.kill()
        sent = watch_sends(monkeypatch)
        got = [m.data for _ in range(6) for m in c.dequeue_many("dr", 100)]
        assert len(got) == 600
        asked = [addr for addr, msg in sent if isinstance(msg, p.Get)]
        # once at most, then its items are read elsewhere (not at all when a lease it was to
        # answer went unanswered: the master's answer past PUSH_TIMEOUT_S named it a suspect)
        assert asked.count(victim.addr) <= 1
