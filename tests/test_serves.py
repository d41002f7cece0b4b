"""Leases a data node answers, the node's side (datanode/serves.py): it keeps one request for
orders out, answers each order with the payloads it holds, and tells the master which it
carried out and which it could not, whatever the order or the store does."""

from __future__ import annotations

import zlib

from blizzard.wire import protocol as p
from datanode import serves
from datanode.serves import ANSWER_S, REFUSED_S, Serving
from datanode.store import MemoryStore


class FakeMaster:
    """The node's connection to the master: what it sent, and replies to hand back."""

    def __init__(self) -> None:
        self.sent: list[p.AwaitServes] = []
        self.replies: dict[int, object] = {}

    def send(self, msg: p.AwaitServes) -> int:
        self.sent.append(msg)
        return len(self.sent)

    def take(self, rid: int) -> object | None:
        return self.replies.pop(rid, None)


class FakeRouter:
    """Pushes to connections, of which only ``connected`` exist."""

    def __init__(self, connected: set[bytes]) -> None:
        self.connected = connected
        self.pushed: list[tuple[bytes, int, p.Pushed]] = []

    def push(self, peer: bytes, rid: int, msg: p.Pushed) -> bool:
        if peer not in self.connected:
            return False
        self.pushed.append((peer, rid, msg))
        return True


def order(seq: int, to: bytes, ids: list[int]) -> p.ServeOrder:
    return p.ServeOrder(seq, to, 40 + seq, ids, b"answer %d" % seq, b"m%d" % seq)


def test_orders_are_answered_with_the_payloads_held_and_reported_in_the_next_ask():
    store = MemoryStore()
    store.put_many([1, 2], [b"one!", b"two!"], [zlib.crc32(b"one!"), zlib.crc32(b"two!")])
    master, router = FakeMaster(), FakeRouter({b"c" * 16})
    serving = Serving("n1", store, router)  # type: ignore[arg-type]
    serving.ask(master, 10.0)
    serving.ask(master, 11.0)  # one is out already: no second
    assert master.sent == [p.AwaitServes("n1", [], [])]
    master.replies[1] = p.Serves([order(1, b"c" * 16, [1, 2, 3]), order(2, b"gone" * 4, [1])])
    serving.collect(master, 12.0)
    ((peer, rid, pushed),) = router.pushed
    assert (peer, rid) == (b"c" * 16, 41)
    assert (pushed.ids, pushed.blobs, pushed.missing) == ([1, 2], [b"one!", b"two!"], [3])
    assert (pushed.answer, pushed.mac) == (b"answer 1", b"m1")  # passed on as they came
    serving.ask(master, 12.0)
    assert master.sent[-1] == p.AwaitServes("n1", [1], [2])  # the second had no connection


def test_a_refused_or_unanswered_ask_is_sent_again_later_and_a_bad_order_fails_alone():
    master, router = FakeMaster(), FakeRouter({b"c" * 16})
    serving = Serving("n1", MemoryStore(), router)  # type: ignore[arg-type]
    serving.ask(master, 0.0)
    master.replies[1] = p.Error("invalid_argument", "no data node 'n1' is registered here")
    serving.collect(master, 1.0)
    serving.ask(master, 1.0 + REFUSED_S / 2)
    assert len(master.sent) == 1  # not before REFUSED_S
    serving.ask(master, 1.0 + REFUSED_S)
    assert len(master.sent) == 2
    serving.ask(master, 1.0 + REFUSED_S + ANSWER_S)  # the master never answered: again
    assert len(master.sent) == 3
    too_many = order(7, b"c" * 16, list(range(1, p.MAX_BATCH + 2)))
    master.replies[3] = p.Serves([too_many, order(8, b"c" * 16, [5])])
    serving.collect(master, 20.0)  # the store has no item 5: pushed as missing
    serving.ask(master, 20.0)
    assert master.sent[-1] == p.AwaitServes("n1", [8], [7])
    assert router.pushed[0][2].missing == [5]


def test_orders_past_the_time_budget_are_reported_failed_for_the_master_to_answer(monkeypatch):
    master, router = FakeMaster(), FakeRouter({b"c" * 16})
    serving = Serving("n1", MemoryStore(), router)  # type: ignore[arg-type]
    serving.ask(master, 0.0)
    monkeypatch.setattr(serves, "SERVE_BUDGET_S", -1.0)  # a slow disk: no time left at all
    master.replies[1] = p.Serves([order(1, b"c" * 16, [5]), order(2, b"c" * 16, [6])])
    serving.collect(master, 1.0)
    serving.ask(master, 1.0)
    assert master.sent[-1] == p.AwaitServes("n1", [], [1, 2]) and not router.pushed
