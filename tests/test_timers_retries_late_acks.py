"""The master's timers, retries and late acks (first found by a review): named leases and paused
queues keep the timers and other long polls going, unique keys keep their caps and their answers
across retries, late acks are answered once, and the gateways' batcher never lets one
connection's stale delete refuse another's."""

from __future__ import annotations

import threading
import time

import pytest

from blizzard.wire import protocol as p
from blizzard.wire.errors import UnknownItem
from master.state import records
from master.state import unique_keys as uniques_mod
from master.state.machine import State

from support.in_process_master import (
    call,
    enqueue_msg,
    in_process_master,
    place,
    report,
    waiting_replies,
)


@pytest.fixture
def master():
    server = in_process_master(replication=1)
    yield server
    server.close()


def configure(master, queue: str, **settings) -> None:
    unset = dict.fromkeys(p.fields_of(p.Configure)) | {"queue": queue, "create": False}
    call(master, p.Configure(**unset | settings))


def put(master, n: int, queue: str = "q", request: str = "r", **changes) -> list[int]:
    placement = place(master, n)
    report(master, placement.ids)
    reply = call(master, p.replace(enqueue_msg(placement.ids, queue=queue, request=request),
                                   **changes))
    assert isinstance(reply, p.Committed)
    return placement.ids


def replayed(master) -> State:
    master.wal.flush()
    s = State()
    for body in master.wal.replay():
        s.apply(records.unpack(body))
    return s


def replies_to(master, peer: bytes) -> list:
    return [reply for who, _, reply in master._replies if who == peer]


# -- named leases and the long-poll waiters ------------------------------------------------------


def test_a_parked_named_lease_does_not_starve_the_queues_other_long_polls(master):
    """A long poll naming ids (here one that does not exist) gets nothing and marks its queue
    "dry" for the pass (master/consume/leases.py serve_waiters): every head long poll parked after
    it is then never served when items come, only answered empty at its timeout."""
    peer_named, peer_head = b"named", b"head"
    assert master.handle(peer_named, 1, p.Lease("q", 1, 30.0, 30.0, "n1", [], [],
                                                ids=[10**9]), time.time(),
                         time.monotonic()) is None
    assert master.handle(peer_head, 2, p.Lease("q", 1, 30.0, 30.0, "h1", [], []), time.time(),
                         time.monotonic()) is None
    ids = put(master, 1)
    master.tick(time.time(), time.monotonic())
    got = replies_to(master, peer_head)
    assert got and got[0].ids == ids, "the head long poll was not served the new item"


def test_a_named_lease_parked_in_a_paused_queue_cannot_wedge_the_timers(master):
    """A lease naming too many ids is refused before it could park (checked before the
    queue's pause is looked at); the long polls parked in the paused queue are served once
    the pause ends, and each pass runs the rest of the master's timers."""
    configure(master, "q", paused_until=time.time() + 0.3)
    good, bad = b"good", b"bad"
    assert master.handle(good, 1, p.Lease("q", 1, 30.0, 30.0, "g1", [], []), time.time(),
                         time.monotonic()) is None
    refused = master.handle(bad, 2, p.Lease("q", 1, 30.0, 30.0, "b1", [], [],
                                            ids=list(range(1, p.MAX_BATCH + 2))),
                            time.time(), time.monotonic())
    assert isinstance(refused, p.Error) and refused.code == "too_many_items"
    ids = put(master, 1)
    time.sleep(0.35)
    master._tick(time.time(), time.monotonic())  # as the loop runs it
    leased = [i for i in ids if i in master.state.held]
    assert leased == ids  # the item was leased (and logged) for the good waiter ...
    assert replies_to(master, good), "... whose reply was dropped: nobody will ever get it"


# -- unique keys --------------------------------------------------------------------------------


def test_a_retried_enqueue_with_a_duplicate_gets_the_same_firsts(master):
    """An enqueue whose second item repeats the first's unique key makes one item; its reply
    names the first id for both. Its retry (same request id: the reply was lost) is answered
    from ``recent_commits`` as ``Committed(count=n)`` without ``firsts``
    (master/produce/enqueue.py), so the client (pipeline._committed) returns its own second id,
    which never existed."""
    placement = place(master, 2)
    report(master, placement.ids)
    msg = p.replace(enqueue_msg(placement.ids, request="dup"), uniques=["k", "k"],
                    unique_for_s=60.0)
    first = call(master, msg)
    assert list(first.firsts) == [placement.ids[0]] * 2
    again = call(master, msg)  # the client's retry after a lost reply
    assert list(again.firsts) == list(first.firsts)


def test_parked_enqueues_cannot_take_more_unique_keys_than_a_queue_may_hold(master,
                                                                           monkeypatch):
    """The cap (MAX_PER_QUEUE, MAX_UNIQUES) is checked when an enqueue arrives, not when its
    record is logged: enqueues parked for their put reports all pass the check against the
    same count, then all land. With MAX_WAITING 10,000 enqueues of 10,000 keys each, the
    master's "at most 1,000,000 keys" does not bound its memory."""
    monkeypatch.setattr(uniques_mod, "MAX_PER_QUEUE", 2)
    a, b = place(master, 2), place(master, 2)
    for placement, keys, rid in ((a, ["a1", "a2"], "ra"), (b, ["b1", "b2"], "rb")):
        msg = p.replace(enqueue_msg(placement.ids, request=rid), uniques=keys,
                        unique_for_s=60.0)
        assert call(master, msg) is None  # parked: no reports yet
    report(master, a.ids + b.ids)
    waiting_replies(master)
    assert master.state.uniques.per_queue.get("q", 0) <= 2, \
        f"queue q holds {master.state.machine.uniques.per_queue['q']} keys, over its cap of 2"


def test_a_refused_enqueue_with_unique_keys_changes_no_state(master, monkeypatch):
    """``_check_uniques`` calls ``uniques.expire(now)`` on the live state when a cap is
    reached: durable state changes outside ``apply``, with no record, even when the enqueue
    is then refused. The live state and a replay of its WAL differ (design: "Replay
    reproduces the state exactly"; "a refused request changes nothing")."""
    monkeypatch.setattr(uniques_mod, "MAX_PER_QUEUE", 1)
    put(master, 1, request="first", uniques=["a"], unique_for_s=0.05)
    time.sleep(0.1)
    bogus = p.replace(enqueue_msg([10**9], request="bogus"), uniques=["b"], unique_for_s=60.0)
    with pytest.raises(UnknownItem):
        call(master, bogus)
    assert replayed(master).snapshot() == master.state.snapshot()


# -- the gateways' batcher ----------------------------------------------------------------------


class _GatedMaster:
    """A client's ``master`` for the batcher's ack lane: the first call waits for ``gate`` (so
    what is submitted meanwhile gathers into one batch), each call goes to ``server``."""

    def __init__(self, server) -> None:
        self.server = server
        self.gate = threading.Event()
        self.calls: list = []

    def call(self, msg):
        if not self.calls:
            self.calls.append(msg)
            assert self.gate.wait(10)
            return p.Acked(done=0, lost=[], why=[])
        self.calls.append(msg)
        return call(self.server, msg)


class _FakeClient:
    def __init__(self, server) -> None:
        self.master = _GatedMaster(server)
        self.pipeline = None

    def close(self) -> None:
        pass


def test_the_batcher_does_not_let_another_connections_stale_delete_refuse_a_valid_one(master):
    """SQS: consumer A's visibility ran out and B received the message (token b). A's late
    delete (token a) and B's delete (token b) meet in one batched ``Ack``; the master counts
    an id named twice once, under its first token (``Leases._settle``), so B's valid delete is
    refused as well (``_send_acks`` hands each waiter the id's one reason). On a standard
    queue the gateway answers B success and the message is not deleted: it comes again."""
    from blizzard.gateways.batcher import Batcher
    from blizzard.wire.errors import BlizzardError

    (item,) = put(master, 1)
    first = call(master, p.Lease("q", 1, 30.0, 0.0, "la", [], []))
    token_a = first.leases[0]
    master.leases.expire(time.time() + 31)  # A's visibility timeout ran out
    second = call(master, p.Lease("q", 1, 30.0, 0.0, "lb", [], []))
    assert second.ids == [item]
    token_b = second.leases[0]

    clients: list[_FakeClient] = []

    def factory():
        clients.append(_FakeClient(master))
        return clients[-1]

    batcher = Batcher(factory)
    acks_client = clients[1]
    results: dict[str, object] = {}

    def delete(name: str, queue: str, item_id: int, lease: int) -> None:
        try:
            batcher.ack(queue, item_id, lease, late=True)
            results[name] = "ok"
        except BlizzardError as exc:
            results[name] = exc

    try:
        blocker = threading.Thread(target=delete, args=("blocker", "q", 10**9, 1))
        blocker.start()
        deadline = time.monotonic() + 5
        while not acks_client.master.calls and time.monotonic() < deadline:
            time.sleep(0.001)
        lane = batcher.acks
        a = threading.Thread(target=delete, args=("a", "q", item, token_a))
        a.start()
        while len(lane.waiting) < 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        b = threading.Thread(target=delete, args=("b", "q", item, token_b))
        b.start()
        while len(lane.waiting) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert len(lane.waiting) == 2
        acks_client.master.gate.set()
        for t in (blocker, a, b):
            t.join(10)
        # the two deletes of one item went in two calls, each naming it once
        assert [list(c.ids) for c in acks_client.master.calls[1:]] == [[item], [item]]
        assert results["b"] == "ok", f"B's valid delete was refused: {results['b']!r}"
        assert item not in master.state.items
    finally:
        batcher.stop()


# -- the beanstalkd gateway ---------------------------------------------------------------------


def test_a_waiting_reserve_says_deadline_soon_when_a_held_jobs_margin_arrives():
    """beanstalkd's protocol: "If the client issues a reserve command during the safety
    margin, or if the safety margin arrives while the client is waiting on a reserve command,
    the server will respond with: DEADLINE_SOON". ``Session._reserve`` looks at the margin
    only when the reserve starts; a reserve waiting while a job it holds enters its last
    second keeps waiting (here until its timeout: TIMED_OUT), and the job's time runs out."""
    import socket
    from types import SimpleNamespace

    from blizzard.gateways import beanstalk_session as bs

    class QuietClient:
        def dequeue(self, tube, wait_s=0.0):
            time.sleep(min(wait_s, 0.2))
            return None

    gateway = SimpleNamespace(client_factory=QuietClient, stopping=threading.Event())
    ours, theirs = socket.socketpair()
    try:
        session = bs.Session(gateway, ours)
        held = SimpleNamespace(id=7, queue="default", lease_s=1.6, lease=1, data=b"x")
        session.reserved[7] = held
        session.deadlines[7] = time.monotonic() + 1.6  # 0.6 s before its safety margin
        started = time.monotonic()
        reply = session._reserve(time.monotonic() + 2.5)
        took = time.monotonic() - started
        assert reply.startswith(b"DEADLINE_SOON"), (reply, round(took, 2))
    finally:
        ours.close()
        theirs.close()


# -- late acks ----------------------------------------------------------------------------------


def test_a_retried_late_ack_is_answered_as_done(master):
    """A late ack finishes an item that is not leased (``_apply_ack`` forgets it through
    ``forget``), so its (id, token) never enters ``recent_acks``: the ack's retry after a lost
    reply (an idempotent call, design: "ack ... idempotent") is refused as an unknown item.
    The SQS gateway answers a FIFO queue's DeleteMessage ReceiptHandleIsInvalid for a delete
    that happened."""
    (item,) = put(master, 1)
    leased = call(master, p.Lease("q", 1, 30.0, 0.0, "l1", [], []))
    master.leases.expire(time.time() + 31)  # its lease ran out; nobody leased it since
    ack = p.Ack([item], leased.leases, False, "q", True)
    assert call(master, ack) == p.Acked(done=1, lost=[], why=[])
    assert call(master, ack) == p.Acked(done=1, lost=[], why=[])  # the retry
