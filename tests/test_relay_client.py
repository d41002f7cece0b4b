"""The client's side of relayed enqueues (blizzard/client/pipeline.py, datanodes.py): the
relaying put goes last and only if the others went; while a relay of a chunk's ids may be on
its way, the client gives them up only on the master's word; an unanswered relay goes to the
master without blocking, and its node relays nothing for a while."""

from __future__ import annotations

import itertools
import time

import zmq

from blizzard.client import pipeline as pipeline_mod
from blizzard.client.datanodes import DatanodePool
from blizzard.client.enqueue_options import EnqueueOptions
from blizzard.client.pipeline import ENQUEUE, EnqueuePipeline
from blizzard.wire import protocol as p

ME = b"c" * 16
META = p.ItemMeta([], "q", 0, 0.0, "", 0, "")
NODES = [p.NodeRef("dn-a", "tcp://127.0.0.1:1"), p.NodeRef("dn-b", "tcp://127.0.0.1:2")]


class Sends:
    """Stands in for the pool's connections: what each sent; ``full``: that one's queue is."""

    def __init__(self, full: str = "") -> None:
        self.full = full
        self.sent: list[tuple[str, object]] = []

    def endpoint(self, addr: str):
        sends = self

        class Ep:
            def send(self, msg):
                if addr == sends.full:
                    raise TimeoutError("queue full")
                sends.sent.append((addr, msg))
                return 1
        return Ep()


def _pool(sends: Sends) -> DatanodePool:
    pool = DatanodePool(zmq.Context.instance(), node_timeout_s=1.0)
    pool.endpoint = sends.endpoint  # type: ignore[method-assign]
    return pool


def test_the_relaying_put_goes_last_and_only_if_every_other_put_went():
    relay = p.Relay(ME, b"frame", b"m" * 16, 5)
    sends = Sends()
    assert _pool(sends).put_reported(NODES, None, [5], [b"x"], [0], META,
                                     relay, "dn-a") == []
    assert [(addr, msg.relay) for addr, msg in sends.sent] == \
        [(NODES[1].addr, None), (NODES[0].addr, relay)]
    sends = Sends(full=NODES[1].addr)  # the other node's put cannot go: the relay stays here
    assert _pool(sends).put_reported(NODES, None, [5], [b"x"], [0], META,
                                     relay, "dn-a") == ["dn-b"]
    assert sends.sent == []


class Master:
    """Stands in for the master link: its endpoint keeps what was sent, answers as told."""

    routing_id = ME
    attempt_s = 2.0

    def __init__(self) -> None:
        self.sent: list[tuple[int, object]] = []
        self.answers: dict[int, object] = {}
        self.forgotten: list[int] = []
        self.rids = itertools.count(1)
        self.endpoint = self
        self.refused = None

    def expect(self) -> int:
        return next(self.rids)

    def send(self, msg) -> int:
        rid = next(self.rids)
        self.sent.append((rid, msg))
        return rid

    def take(self, rid):
        return self.answers.pop(rid, None)

    def has(self, rid) -> bool:
        return rid in self.answers

    def forget(self, rid) -> None:
        self.forgotten.append(rid)

    def call_id(self) -> str:
        return "call-1"

    def enqueue_wait_s(self, node_wait_s: float) -> float:
        return node_wait_s + 2.0


class NoReplies:
    def __init__(self, endpoints) -> None:
        pass

    def read(self, *args) -> None:
        pass


def _relayed_chunk(monkeypatch, sends: Sends):
    monkeypatch.setattr(pipeline_mod, "Replies", NoReplies)
    master = Master()
    pipeline = EnqueuePipeline(master, _pool(sends))  # type: ignore[arg-type]
    chunk = pipeline.chunks("q", [b"payload"], EnqueueOptions())[0]
    placement = p.Placement(5, 1, NODES, 2, 30.0, p.PutGrant(5, 1, ["dn-a", "dn-b"], 0, 0.0, b""),
                            [], b"k" * 16)
    pipeline._send(chunk, placement, [5])
    assert chunk.step == ENQUEUE and chunk.relayed and chunk.relay_by == "dn-a"
    assert master.sent == []  # the enqueue rode with the payloads
    return pipeline, master, chunk


def test_an_unanswered_relay_goes_to_the_master_at_once_and_its_node_relays_no_more(monkeypatch):
    pipeline, master, chunk = _relayed_chunk(monkeypatch, Sends())
    relay_rid = chunk.rid
    chunk.until = time.monotonic() - 1  # the wait for the relay's answer ran out
    pipeline.pump([chunk], block=False)
    ((rid, msg),) = master.sent  # the same enqueue, sent without waiting for its answer
    assert msg is chunk.enqueue_msg and chunk.rid == rid and not chunk.done
    assert master.forgotten == [relay_rid]
    assert "dn-a" in pipeline.relay_avoid and "dn-a" not in pipeline.nodes.suspected()
    master.answers[rid] = p.Committed(1)
    pipeline.pump([chunk], block=False)
    assert chunk.done and chunk.ids == [5]
    # the next chunk relays through the other node
    second = pipeline.chunks("q", [b"more"], EnqueueOptions())[0]
    pipeline._send(second, p.replace(chunk.placement, first=6), [6])
    assert second.relay_by == "dn-b"


def test_ids_a_relay_may_still_land_with_are_given_up_only_on_the_masters_word(monkeypatch):
    sends = Sends()
    pipeline, master, chunk = _relayed_chunk(monkeypatch, sends)
    chunk.until = time.monotonic() - 1
    pipeline.pump([chunk], block=False)  # to the master itself, which asks for another copy
    ((rid, _),) = master.sent
    sends.full = "tcp://127.0.0.1:3"  # ... on a node whose queue is full
    master.answers[rid] = p.PutAlso([p.NodeRef("dn-c", "tcp://127.0.0.1:3")],
                                    p.PutGrant(5, 1, ["dn-c"], 0, 0.0, b""), ["dn-a"], [])
    pipeline.pump([chunk], block=False)
    # not placed again under fresh ids (the relay could land beside them): asked again
    assert [type(msg) for _, msg in master.sent] == [p.Enqueue, p.Enqueue]
    assert chunk.ids == [5] and "dn-c" in pipeline.nodes.suspected()
