"""A sharded client when one shard cannot serve: its trouble stays its own (unit tests).

Each shard is an in-memory twin of a per-shard ``Client`` (``FakeShard``): it leases, acks and
extends, or fails as a dead, rebuilding or standby master does. The real clusters' side of
this is in ``tests/test_shards.py``.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest

from blizzard.client.sharded import pick as shard_pick
from blizzard.client.sharded.acks import AcksInFlight
from blizzard.client.sharded.client import ShardedClient
from blizzard.client.sharded.writes import ShardedProducer
from blizzard.wire import protocol as p
from blizzard.wire.errors import LeaseExpired, MasterStarting, MasterUnavailable
from blizzard.wire.shard_messages import first_id

_rids = itertools.count(1)


class FakeEndpoint:
    def __init__(self, shard: FakeShard) -> None:
        self.shard, self.replies, self.addr = shard, {}, f"tcp://127.0.0.1:{7000 + shard.k}"

    def send(self, msg: Any) -> int:
        rid = next(_rids)
        if self.shard.fault is None:
            self.replies[rid] = self.shard.ack(msg.ids, msg.leases)
        return rid

    def head(self, msg: p.Head) -> Any:
        if self.shard.fault is not None:
            return TimeoutError("down")
        return p.QueueHead(msg.queue, self.shard.k, len(self.shard.ready), 0, 0.0, 0)

    def has(self, rid: int) -> bool:
        return rid in self.replies

    def take(self, rid: int) -> Any:
        return self.replies.pop(rid, None)

    def wait(self, timeout_ms: int) -> bool:
        return False

    def read_ready(self, want: int = 0) -> None:
        pass


class FakeLink:
    def __init__(self, shard: FakeShard) -> None:
        self.shard, self.endpoint, self.addr, self.timeout_s = shard, FakeEndpoint(shard), "x", 5.0
        self.moved = 0

    def call(self, msg: Any, **_: Any) -> Any:
        assert isinstance(msg, p.Hello)
        if self.shard.fault is not None:
            raise self.shard.fault
        return p.Welcome(False, b"", "", primary=self.shard.primary_of, shard=self.shard.k,
                         heads=self.shard.heads)

    def move_on(self, reply: Any) -> None:
        self.moved += 1


class FakeShard:
    """One shard's ``Client``: ``items`` ready ids; ``fault`` raised by every call while set."""

    def __init__(self, k: int, items: int = 0) -> None:
        self.k, self.fault, self.primary_of, self.heads = k, None, "", ""
        self.ready = [first_id(k) + i for i in range(items)]
        self.held: dict[int, int] = {}  # id -> lease token
        self.acked: list[int] = []
        self.nacked: list[int] = []
        self.extended: list[int] = []
        self.ctx, self.timeout_s, self.keys = None, 5.0, None
        self.master = FakeLink(self)
        self.leases = SimpleNamespace(lease_columns=self.lease_columns)

    def ack(self, ids: list[int], leases: list[int]) -> p.Acked:
        lost = [i for i, t in zip(ids, leases, strict=True)
                if self.held.get(i) != t and i not in self.acked]
        for i in ids:
            if i not in lost and self.held.pop(i, None) is not None:
                self.acked.append(i)
        return p.Acked(len(ids) - len(lost), lost)

    def _check(self) -> None:
        if self.fault is not None:
            raise self.fault

    def lease_columns(self, queue: str, n: int, *, ack=(), head=False, **_: Any) -> p.Leased:
        self._check()
        if ack:
            self.ack([m.id for m in ack], [m.lease for m in ack])
        ids, self.ready = self.ready[:n], self.ready[n:]
        for i in ids:
            self.held[i] = i + 7
        cols = [[0] * len(ids) for _ in range(4)]  # sizes, crcs, attempts, priorities
        return p.Leased(queue, ids, [i + 7 for i in ids], *cols, [0.0] * len(ids),
                        [""] * len(ids), [0] * len(ids), [p.ReplicaSet([])], [],
                        p.GetGrant([], [], 0, 0.0, b""), [""] * len(ids),
                        head_ready=-1)

    def ack_many(self, msgs: Any) -> None:
        self._check()
        self.ack([m.id for m in msgs], [m.lease for m in msgs])

    def nack_ids(self, ids: Any, leases: Any, **_: Any) -> None:
        self.nacked += ids
        for i in ids:
            self.held.pop(i, None)

    def extend_many(self, msgs: Any, **_: Any) -> None:
        self._check()
        self.extended += [m.id for m in msgs]

    def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def fakes(monkeypatch):
    monkeypatch.setattr(AcksInFlight, "ACK_WAIT_S", 0.05)
    monkeypatch.setattr(shard_pick, "call_many",
                        lambda calls, _timeout_s: [ep.head(msg) for ep, msg in calls])


def sharded(*shards: FakeShard, peeks: int = 1) -> ShardedClient:
    it = iter(shards)
    return ShardedClient([f"s{k}" for k in range(len(shards))], lambda _addr, **_: next(it),
                         peeks=peeks, heads=False)


def test_a_dead_shards_acks_are_owed_not_a_lost_lease_elsewhere():
    a, b = FakeShard(0, items=2), FakeShard(1, items=0)
    c = sharded(a, b)
    first = c.lease("q", 2)
    assert [m.id for m in first] == [first_id(0), first_id(0) + 1]
    b.ready = [first_id(1) + i for i in range(3)]
    a.fault = MasterUnavailable("shard 0 is down")
    c.picker.down[0] = float("inf")  # as a lease there would have found
    second = c.lease("q", 3, ack=first)  # the acks are for the dead shard
    assert [m.id for m in second] == [first_id(1) + i for i in range(3)]
    assert b.nacked == [] and len(b.held) == 3  # the good lease was neither lost nor undone
    assert sorted(m.id for m in c.acks.owed) == [m.id for m in first]
    a.fault = None  # the shard is back: the owed acks go with the next lease
    c.picker.down.clear()
    c.lease("q", 1, ack=second)
    assert a.acked == [m.id for m in first] and c.acks.owed == []
    assert sorted(b.acked) == [m.id for m in second]


def test_acks_ride_on_a_lease_to_their_shard_and_follow_one_that_goes_elsewhere():
    a, b = FakeShard(0, items=2), FakeShard(1, items=0)
    c = sharded(a, b)
    first = c.lease("q", 2)  # shard 0's; it is empty now
    b.ready = [first_id(1) + i for i in range(3)]
    second = c.lease("q", 3, ack=first)  # from shard 1: shard 0's acks are sent beside it
    assert a.acked == [m.id for m in first]  # in this very call, not some later one
    a.ready, b.ready = [first_id(0) + 5], []
    c.lease("q", 1, ack=second)
    assert sorted(b.acked) == [m.id for m in second]


def test_a_shard_that_is_rebuilding_is_passed_over_and_the_lease_goes_elsewhere():
    a, b = FakeShard(0, items=5), FakeShard(1, items=5)
    a.fault = MasterStarting("rebuilding")
    c = sharded(a, b, peeks=2)
    got = c.lease("q", 2)
    assert [shard_k(m.id) for m in got] == [1, 1]
    assert c.picker.is_down(0) and not c.picker.is_down(1)


def shard_k(item_id: int) -> int:
    return item_id >> 56


def test_a_standby_is_not_taken_for_a_misplaced_shard():
    a, b = FakeShard(0, items=1), FakeShard(1, items=1)
    b.primary_of = "tcp://127.0.0.1:1"  # shard 1's primary is down; its standby answers
    c = sharded(a, b, peeks=2)
    with pytest.raises(MasterUnavailable, match="standby"):
        c._hello(1)
    assert 1 not in c._checked and b.master.moved == 1
    got = c.lease("q", 5)  # shard 0 still serves
    assert [shard_k(m.id) for m in got] == [0]


def test_after_a_shards_standby_takes_over_the_client_joins_its_heads_feed():
    a, b = FakeShard(0, items=1), FakeShard(1, items=1)
    a.heads, b.heads = "tcp://127.0.0.1:7100", "tcp://127.0.0.1:7101"
    c = sharded(a, b)
    joined: list[str] = []
    c.feed = SimpleNamespace(connect=joined.append)  # the feed's side: where it connects
    c._hello(0)
    c._hello(0)  # once per master
    assert joined == ["tcp://127.0.0.1:7100"]
    a.master.endpoint.addr, a.heads = "tcp://127.0.0.1:7200", "tcp://127.0.0.1:7300"  # promoted
    c._hello(0)
    assert joined == ["tcp://127.0.0.1:7100", "tcp://127.0.0.1:7300"]


def test_extend_and_ack_reach_every_shard_though_one_fails():
    a, b = FakeShard(0, items=2), FakeShard(1, items=2)
    c = sharded(a, b)
    held = c.lease("q", 2) + c.lease("q", 2)
    assert {shard_k(m.id) for m in held} == {0, 1}
    first = next(s for s in (a, b) if s.held and shard_k(held[0].id) == s.k)
    first.fault = LeaseExpired("gone")
    other = b if first is a else a
    with pytest.raises(LeaseExpired):
        c.extend_many(held, lease_s=10.0)
    assert len(other.extended) == 2
    first.fault = MasterUnavailable("down")
    with pytest.raises(MasterUnavailable):
        c.ack_many(held)
    assert len(other.acked) == 2


class FlakyProducer:
    def __init__(self, ids: list[int], fail: bool) -> None:
        self.ids, self.fail, self.sent = ids, fail, 0

    def send(self, items: Any) -> None:
        self.sent += len(items)

    def flush(self) -> list[int]:
        if self.fail:
            raise MasterUnavailable("down")
        return self.ids[:self.sent]


def test_a_producer_flushes_every_shard_though_one_fails_and_can_go_on():
    client = SimpleNamespace(shards=[0, 1], rng=SimpleNamespace(randrange=lambda n: 0))
    producers = {0: FlakyProducer([10, 11], fail=True), 1: FlakyProducer([20, 21], fail=False)}
    client._shard = lambda k: SimpleNamespace(producer=lambda *a, **kw: producers[k])
    prod = ShardedProducer(client, "q", window=1, options={})
    prod.send([b"a"])
    prod.send([b"b"])
    with pytest.raises(MasterUnavailable):
        prod.flush()
    assert producers[1].sent == 1 and prod.sent == []  # shard 1 flushed; nothing stale kept
    producers[0].fail = False
    assert prod.flush() == []
