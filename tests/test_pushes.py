"""Leases a data node answers, the master's side (master/consume/pushes.py): which node gets the
order, and that every lease is answered whatever the node does (reports it failed, is late,
goes away)."""

from __future__ import annotations

import pytest

from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument
from blizzard.wire.push_signature import opened
from master.consume import pushes as pushes_mod
from master.consume.pushes import AWAIT_S, MAX_PUSHED_BYTES, MAX_SERVES, PUSH_TIMEOUT_S, Pushes

TO = b"r" * 16  # the consumer's routing id on its data-node connections
KEY = b"k" * 16  # ... and its secret


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def leased(ids: list[int], *node_sets: list[str], suspects: list[str] = (),
           lost: list[int] = ()) -> p.Leased:
    sets = node_sets or (["n1", "n2"],)
    n = len(ids)
    return p.Leased("q", ids, [7] * n, [3] * n, [0] * n, [0] * n, [0] * n, [0.0] * n, [""] * n,
                    [i % len(sets) for i in range(n)],
                    [p.ReplicaSet([p.NodeRef(node, f"tcp://127.0.0.1:{9000 + k}")
                                   for k, node in enumerate(s)]) for s in sets],
                    list(lost), p.GetGrant(ids, sorted({x for s in sets for x in s}), 0, 0.0, b""),
                    [""] * n, suspects=list(suspects))


@pytest.fixture
def desk():
    sent: list[tuple[bytes, int, object]] = []
    clock = Clock()
    return Pushes(lambda peer, rid, msg: sent.append((peer, rid, msg)), clock), sent, clock


def lease(push_to: bytes = TO, push_key: bytes = KEY) -> p.Lease:
    return p.Lease("q", 1, 30.0, 0.0, "call-1", [], [], push_to=push_to, push_key=push_key)


def test_a_lease_that_wants_a_push_is_handed_to_a_waiting_node_and_reported_served(desk):
    pushes, sent, _ = desk
    assert pushes.await_serves(p.AwaitServes("n2", [], []), b"N2", 1) is None  # parked
    pushes.want(lease(), b"c", 5)
    answer = leased([11])
    pushes.send(b"c", 5, answer)
    assert sent == []  # queued for n2, which holds the item and waits
    pushes.flush()
    ((peer, rid, serves),) = sent
    assert (peer, rid) == (b"N2", 1)
    (order,) = serves.orders
    assert (order.to, order.rid, order.ids, order.answer) == (TO, 5, [11], p.encode(5, answer))
    assert opened(KEY, 5, order.answer, order.mac) == answer  # signed for the consumer alone
    assert opened(b"x" * 16, 5, order.answer, order.mac) is None
    assert opened(KEY, 6, order.answer, order.mac) is None  # the answer to another request
    sent.clear()
    assert pushes.await_serves(p.AwaitServes("n2", [order.seq], []), b"N2", 2) is None
    assert sent == [] and pushes.pushed == 1 and not pushes.out  # nobody else answers it


def order_out(pushes: Pushes, sent: list) -> tuple[p.Leased, int]:
    """Node n1 waits for orders and is handed the lease of consumer c's request 5: its
    answer, and the order's seq (the messages sent so far are forgotten)."""
    pushes.await_serves(p.AwaitServes("n1", [], []), b"N1", 1)
    pushes.want(lease(), b"c", 5)
    answer = leased([11])
    pushes.send(b"c", 5, answer)
    pushes.flush()
    seq = sent[0][2].orders[0].seq
    sent.clear()
    return answer, seq


def test_an_order_the_node_could_not_carry_out_is_answered_by_the_master(desk):
    pushes, sent, _ = desk
    answer, seq = order_out(pushes, sent)
    pushes.await_serves(p.AwaitServes("n1", [], [seq]), b"N1", 2)
    assert sent == [(b"c", 5, answer)] and pushes.direct == 1


def test_a_late_node_costs_its_consumers_the_timeout_once_then_gets_no_orders(desk):
    pushes, sent, clock = desk
    answer, seq = order_out(pushes, sent)
    assert pushes.next_wake() == pytest.approx(clock.now + PUSH_TIMEOUT_S)
    clock.now += PUSH_TIMEOUT_S / 2
    pushes.expire()
    assert sent == []
    clock.now += PUSH_TIMEOUT_S
    pushes.expire()
    # the master answers, naming the late node a suspect: the consumer's read asks it last
    assert sent == [(b"c", 5, p.replace(answer, suspects=["n1"]))]
    sent.clear()
    pushes.want(lease(), b"c", 6)
    pushes.send(b"c", 6, answer)
    assert sent == [(b"c", 6, answer)]  # n1 gets no order until it asks again
    pushes.await_serves(p.AwaitServes("n1", [seq], []), b"N1", 2)  # a late report
    assert pushes.pushed == 0  # of an order already answered: nothing happens


@pytest.mark.parametrize("case", ["no push_to", "no node waits", "empty", "lost acks",
                                  "two replica sets", "suspected", "an error"])
def test_these_leases_are_answered_by_the_master_at_once(desk, case):
    pushes, sent, _ = desk
    pushes.await_serves(p.AwaitServes("n1", [], []), b"N1", 1)
    answer: object = {
        "no push_to": leased([11]), "no node waits": leased([11], ["n3"]),
        "empty": leased([]), "lost acks": leased([11], lost=[9]),
        "two replica sets": leased([11, 12], ["n1"], ["n2"]),
        "suspected": leased([11], ["n1"], suspects=["n1"]),
        "an error": p.Error("invalid_argument", "no"),
    }[case]
    pushes.want(lease(b"" if case == "no push_to" else TO), b"c", 5)
    pushes.send(b"c", 5, answer)
    assert sent == [(b"c", 5, answer)] and not pushes.out and not pushes.wanted


def test_a_parked_await_is_answered_empty_in_time_and_a_silent_node_is_forgotten(desk):
    pushes, sent, clock = desk
    pushes.await_serves(p.AwaitServes("n1", [], []), b"N1", 1)
    assert pushes.next_wake() == pytest.approx(clock.now + AWAIT_S)
    clock.now += AWAIT_S
    pushes.expire()
    assert sent == [(b"N1", 1, p.Serves([]))] and "n1" in pushes.listening
    clock.now += 2 * AWAIT_S + 1  # it never asked again
    pushes.expire()
    assert "n1" not in pushes.listening and pushes.next_wake() is None


def test_hostile_requests_are_refused_and_what_is_remembered_is_bounded(desk, monkeypatch):
    pushes, sent, _ = desk
    with pytest.raises(InvalidArgument, match="routing id"):
        pushes.want(lease(b"x" * 256), b"c", 5)
    with pytest.raises(InvalidArgument, match="routing id"):  # one ZeroMQ made up: 5 bytes
        pushes.want(lease(b"\x00\x80\x00\x00\x01"), b"c", 5)
    with pytest.raises(InvalidArgument, match="secret"):  # no secret to sign with
        pushes.want(lease(push_key=b""), b"c", 5)
    with pytest.raises(InvalidArgument, match="at most"):
        pushes.await_serves(p.AwaitServes("n1", list(range(MAX_SERVES + 1)), []), b"N1", 1)
    assert not pushes.listening  # refused before anything changed
    monkeypatch.setattr(pushes_mod, "MAX_WANTED", 3)
    for rid in range(10):
        pushes.want(lease(), b"c", rid)
    assert list(pushes.wanted) == [(b"c", 7), (b"c", 8), (b"c", 9)]
    pushes.await_serves(p.AwaitServes("n1", [], []), b"N1", 1)
    pushes.send(b"c", 2, leased([11]))  # forgotten as wanting a push: answered directly
    assert sent[-1][:2] == (b"c", 2)
    # an order reported by a node it was not given to is not taken as served
    pushes.send(b"c", 9, leased([11]))
    pushes.flush()
    seq = sent[-1][2].orders[0].seq
    pushes.await_serves(p.AwaitServes("n2", [seq], []), b"N2", 3)
    assert seq in pushes.out and pushes.pushed == 0


def test_big_answers_go_direct_and_a_serves_holds_a_bounded_share_each_timed_from_hand_out(
        desk):
    pushes, sent, clock = desk
    pushes.await_serves(p.AwaitServes("n1", [], []), b"N1", 1)
    big = p.replace(leased([11]), errors=["x" * MAX_PUSHED_BYTES])
    pushes.want(lease(), b"c", 1)
    pushes.send(b"c", 1, big)
    assert sent == [(b"c", 1, big)]  # too big to push with payloads: the master's
    sent.clear()
    for rid in range(2, MAX_SERVES + 12):
        pushes.want(lease(), b"c", rid)
        pushes.send(b"c", rid, leased([11]))
    clock.now += PUSH_TIMEOUT_S * 0.9  # the node is slow to come back for the rest
    pushes.flush()
    assert [len(msg.orders) for _, _, msg in sent] == [MAX_SERVES]
    first = sent[0][2].orders
    sent.clear()
    clock.now += PUSH_TIMEOUT_S * 0.2
    pushes.expire()  # the ten left in the queue were due: the master answers them
    late = p.replace(leased([11]), suspects=["n1"])  # answered by the master, n1 suspected
    assert [msg for _, _, msg in sent] == [late] * 10
    assert all(order.seq in pushes.out for order in first)  # handed out just now: not due
    sent.clear()
    # the node, late for those ten, asks again meanwhile: it keeps its request and listens
    pushes.await_serves(p.AwaitServes("n1", [o.seq for o in first], []), b"N1", 2)
    assert "n1" in pushes.listening and "n1" in pushes.awaiting and not pushes.out


def test_a_new_masters_order_numbers_are_not_an_old_ones():
    a, b = Pushes(lambda *_: None), Pushes(lambda *_: None)
    assert a.seq != b.seq and min(a.seq, b.seq) > 0
