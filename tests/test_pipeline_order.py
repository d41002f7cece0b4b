"""An ``enqueue_many`` of many chunks keeps its items in order: the master hands ids out in the
order it is asked, so a chunk may take a placement's spare ids only if no chunk asked for ids
after that placement (the pipeline in process, its master and data nodes stood in for)."""

from __future__ import annotations

from typing import Any

from blizzard.client.enqueue_options import EnqueueOptions
from blizzard.client.pipeline import Chunk, EnqueuePipeline
from blizzard.wire import protocol as p


class Nodes:
    def own_suspects(self) -> list[str]:
        return []

    def heard(self, suspects: list[str]) -> None:
        pass


class Master:
    """Hands ids out in the order it is asked, as the real one does."""

    def __init__(self) -> None:
        self.next_id = 1

    def place(self, msg: p.Place) -> p.Placement:
        first, self.next_id = self.next_id, self.next_id + msg.n
        grant = p.PutGrant(first, msg.n, ["dn-a"], 0, 0.0, b"")
        return p.Placement(first, msg.n, [p.NodeRef("dn-a", "tcp://127.0.0.1:1")], 1, 30.0,
                           grant)


def pipeline() -> tuple[EnqueuePipeline, list[tuple[Chunk, p.Place]], dict[int, list[int]]]:
    pipe = EnqueuePipeline(master=None, nodes=Nodes())  # type: ignore[arg-type]
    asked: list[tuple[Chunk, p.Place]] = []
    sent: dict[int, list[int]] = {}
    pipe._ask_master = lambda c, msg: asked.append((c, msg))  # type: ignore[method-assign]

    def send(c: Chunk, placement: p.Placement, ids: list[int]) -> None:
        c.ids = ids
        sent[id(c)] = ids

    pipe._send = send  # type: ignore[method-assign]
    return pipe, asked, sent


def chunk(n: int) -> Chunk:
    blobs = [b"x"] * n
    return Chunk("q", blobs, [0] * n, EnqueueOptions.make(0, 0.0), True)


def test_a_chunk_that_asked_for_ids_is_not_overtaken_by_an_earlier_placements_spares():
    pipe, asked, _ = pipeline()
    master = Master()
    first, second, third = chunk(10), chunk(10), chunk(10)
    pipe.start(first)  # asks for spares too (ids for several small chunks)
    pipe.start(second)  # the first is still placing: asks for its own ids, after the first's
    assert [msg.n for _, msg in asked] == [64, 10]
    replies: dict[int, Any] = {id(c): master.place(msg) for c, msg in asked}
    pipe._advance(first, replies[id(first)])  # ids 1-10, spares 11-64
    pipe._advance(second, replies[id(second)])  # ids 65-74
    pipe.start(third)  # must not take 11-20 from the first's spares: they lie below 65
    if len(asked) == 3:
        pipe._advance(third, master.place(asked[2][1]))
    assert first.ids < second.ids < third.ids
    assert min(third.ids) > max(second.ids)


def test_spares_left_below_a_new_placement_are_not_used_after_it():
    pipe, asked, _ = pipeline()
    master = Master()
    big, small = chunk(30), chunk(30)
    pipe.start(big)  # asks for 120: 30 used, 90 spare (31-120)
    pipe._advance(big, master.place(asked[0][1]))
    middle = chunk(100)  # more than the 90 spares: a placement of its own
    pipe.start(middle)
    pipe.start(small)  # before the middle's ids come: the old spares lie below them
    pipe._advance(middle, master.place(asked[1][1]))
    if len(asked) == 3:
        pipe._advance(small, master.place(asked[2][1]))
    assert max(big.ids) < min(middle.ids) and max(middle.ids) < min(small.ids)


def test_spares_still_serve_the_next_small_chunks_when_nobody_asked_in_between():
    pipe, asked, _ = pipeline()
    master = Master()
    chunks = [chunk(10) for _ in range(4)]
    pipe.start(chunks[0])
    pipe._advance(chunks[0], master.place(asked[0][1]))
    for c in chunks[1:]:
        pipe.start(c)  # from the spares: no round trip
    assert len(asked) == 1
    assert [c.ids[0] for c in chunks] == [1, 11, 21, 31]
