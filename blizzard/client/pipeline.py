"""The enqueue pipeline: chunks of items through place -> put + enqueue, several in flight.

``Client.enqueue``/``enqueue_many``, ``Client.stage`` and ``Producer`` all drive it. A chunk
(at most ``CHUNK_ITEMS`` items and about ``CHUNK_BYTES``) needs ids and a placement: it takes
them from the block of ids the client holds, used for a third of the master's deadline, and
asks the master (``Place``) for a new block, enough for a few chunks like it, when that one
is used up. Then the payloads go
to every placed data node (``Put`` with ``report``: the node tells the master, not us) and, at
the same time, the ``Enqueue`` to the master, which answers once enough nodes reported the
payloads durable and the items are logged (P1). A one-item enqueue with a block in hand is
therefore one round trip. Chunks move on by one step per reply, without waiting for the other
chunks, so the round trips and fsyncs of the chunks in flight overlap.

When a step goes wrong the chunk is helped along synchronously, then moves on as before:

- a place not answered in ``ATTEMPT_S``, or answered "master starting", is sent again with
  back-off until ``timeout_s``; where avoiding suspected nodes leaves too few for a placement,
  it is asked for again without avoiding them (a suspect is better than no write at all);
- an enqueue answered ``PutAlso`` (some placed nodes had not reported the payloads within the
  master's hedge delay) puts the payloads on the nodes it names as well, avoids the slow ones
  for a while, and sends the same enqueue again: the copies already made still count, so a
  write does not wait on one slow or dead node;
- an enqueue answered ``Unstored`` (a node refused the payloads, or no node was left to hedge
  with and the placed ones did not report in ``node_timeout_s``) makes those nodes suspected
  and goes again under fresh ids placed without them, ``PUT_ATTEMPTS`` in all;
- an enqueue not answered in time is sent again under its request id, so one that landed is
  applied once; one the master does not know (it restarted, so nothing of the chunk is
  visible) goes again under fresh ids, ``PUT_ATTEMPTS`` in all. Payloads stored under ids
  that were never enqueued are deleted by the master.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import weakref
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from blizzard.client.datanodes import SLOW_S, DatanodePool
from blizzard.client.enqueue_options import EnqueueOptions, as_bytes
from blizzard.client.master_link import MasterLink, is_retryable
from blizzard.net.transport import Endpoint, Replies, raise_if_error
from blizzard.wire import protocol as p
from blizzard.wire.codec import as_ids
from blizzard.wire.errors import (
    DatanodeUnavailable,
    NotEnoughDatanodes,
    PayloadTooLarge,
    ProtocolError,
    UnknownItem,
)
from blizzard.wire.queue_settings import check_queue_name

log = logging.getLogger(__name__)

CHUNK_ITEMS = 1000  # items per place/put/enqueue
CHUNK_BYTES = 16 * 1024 * 1024
PUT_ATTEMPTS = 4
ENQUEUE_WINDOW = 8  # chunks in flight for one enqueue_many or stage call
BLOCK_IDS = 64  # ids a client asks for at least, for small chunks
BLOCK_CHUNKS = 4  # ... and enough for this many chunks of the size at hand
BLOCK_MAX = 4000  # ... but no more than this
MAX_EXCLUDE = 64  # nodes a place may ask to avoid (the master takes no more)

PLACE, ENQUEUE, DONE = range(3)

# (ids, node ids, grants) per chunk, for commit(): the grants of the ids' placements prove
# to a secure master that the committer staged them (the ids are sequential, so guessable)
Staged = list[tuple[list[int], list[str], list[p.PutGrant]]]


@dataclass(eq=False)
class Chunk:
    """Items on their way into a queue, and the step they are at."""

    queue: str
    blobs: list[bytes]
    crcs: list[int]
    opts: EnqueueOptions
    commit: bool  # False: done once stored, kept pending by the master (Client.stage)
    result_of: list[int] = dataclasses.field(default_factory=list)  # results: each its job
    result_leases: list[int] = dataclasses.field(default_factory=list)  # and its lease token
    step: int = PLACE
    ids: list[int] = dataclasses.field(default_factory=list)
    placement: p.Placement | None = None
    stored_on: list[str] = dataclasses.field(default_factory=list)
    place_msg: p.Place | None = None
    enqueue_msg: p.Enqueue | None = None
    meta: p.ItemMeta | None = None  # what the data nodes keep beside the blobs
    failures: int = 0  # enqueues refused for want of stored payloads, or forgotten
    ep: Endpoint | None = None  # where the step's request went (None: it could not be sent)
    rid: int = 0
    until: float = 0.0  # monotonic time the reply is overdue
    since: float = 0.0  # monotonic time the current master step began: retries count from it

    @property
    def done(self) -> bool:
        return self.step == DONE


@dataclass
class Block:
    """Ids held for small chunks: ``placement``'s ids from ``next`` on, usable until ``until``."""

    placement: p.Placement
    next: int
    until: float

    def take(self, n: int, now: float, avoid: list[str]) -> list[int] | None:
        pl = self.placement
        if now >= self.until or self.next + n > pl.first + pl.n \
                or any(ref.node_id in avoid for ref in pl.nodes):
            return None
        first, self.next = self.next, self.next + n
        return list(range(first, first + n))


def split(items: Iterable[Any], chunk_items: int = CHUNK_ITEMS) -> list[list[bytes]]:
    """Payloads as bytes, cut into chunks of at most ``chunk_items`` items and about
    CHUNK_BYTES."""
    chunks: list[list[bytes]] = [[]]
    size = 0
    for blob in map(as_bytes, items):
        if len(blob) > p.MAX_ITEM_BYTES:  # no master takes it: refused before it is sent
            raise PayloadTooLarge(f"an item of {len(blob)} bytes exceeds the largest any "
                                  f"cluster allows ({p.MAX_ITEM_BYTES} bytes)")
        if len(chunks[-1]) >= chunk_items or (size + len(blob) > CHUNK_BYTES and chunks[-1]):
            chunks.append([])
            size = 0
        chunks[-1].append(blob)
        size += len(blob)
    return chunks if chunks[0] else []


class EnqueuePipeline:
    """Moves chunks through place -> put + enqueue over the master link and the data-node pool."""

    def __init__(self, master: MasterLink, nodes: DatanodePool) -> None:
        self.master = master
        self.nodes = nodes
        self.block: Block | None = None
        # chunks waiting for a placement: while one is, no other asks for spare ids (only one
        # block's spares can be kept, so more would sit unused at the master until they expire)
        self.placing: weakref.WeakSet[Chunk] = weakref.WeakSet()
        # the chunk that asked for ids last: only its placement's spares may serve later
        # chunks, since the master hands ids out in the order it is asked (FIFO by id)
        self.last_placed: Chunk | None = None

    def chunks(self, queue: str, items: Iterable[Any], opts: EnqueueOptions, *,
               commit: bool = True, chunk_items: int = CHUNK_ITEMS,
               result_of: Sequence[int] = (), result_leases: Sequence[int] = ()) -> list[Chunk]:
        """``items`` cut into chunks, not started yet (a payload that is not bytes fails here);
        ``result_of``: the items are results, item i of job ``result_of[i]``."""
        check_queue_name(queue)
        chunks = [Chunk(queue, blobs, [zlib.crc32(b) for b in blobs], opts, commit)
                  for blobs in split(items, chunk_items)]
        if result_of:
            start = 0
            for chunk in chunks:
                chunk.result_of = list(result_of[start:start + len(chunk.blobs)])
                chunk.result_leases = list(result_leases[start:start + len(chunk.blobs)])
                start += len(chunk.blobs)
        return chunks

    def enqueue(self, queue: str, items: Iterable[Any], opts: EnqueueOptions,
                result_of: Sequence[int] = (), result_leases: Sequence[int] = ()) -> list[int]:
        """Every item committed, in order; their ids."""
        chunks = self.chunks(queue, items, opts, result_of=result_of, result_leases=result_leases)
        if len(chunks) == 1:  # the common call: no window needed
            self.start(chunks[0])
            while not chunks[0].done:
                self.pump(chunks, block=True)
            return chunks[0].ids
        window = Window(self, ENQUEUE_WINDOW)
        for chunk in chunks:
            window.add(chunk)
        return [i for chunk in window.wait() for i in chunk.ids]

    def stage(self, queue: str, items: Iterable[Any], opts: EnqueueOptions) -> Staged:
        """Every item stored durably but not committed; (ids, node ids) per chunk."""
        window = Window(self, ENQUEUE_WINDOW)
        for chunk in self.chunks(queue, items, opts, commit=False):
            window.add(chunk)
        return [staged_chunk(chunk) for chunk in window.wait()]

    def commit(self, staged: Staged) -> None:
        """Make staged chunks visible, all in one round trip (idempotent)."""
        if staged:
            self.master.call_many([p.Commit(as_ids(ids), nodes, self.master.call_id(), grants)
                                   for ids, nodes, grants in staged])

    # -- the steps ---------------------------------------------------------------------------

    def start(self, c: Chunk) -> None:
        """Ids and a placement for the chunk: from the block in hand, else from the master."""
        n = len(c.blobs)
        block = self.block
        ids = block.take(n, time.monotonic(), self.nodes.own_suspects()) if block else None
        if block is not None and ids is not None:
            self._send(c, block.placement, ids)
            return
        want = n if self.placing else max(n, min(max(BLOCK_IDS, BLOCK_CHUNKS * n), BLOCK_MAX))
        # the block's ids left lie below the ids this placement gets: a later chunk taking
        # them would go before this one in the queue
        self.block = None
        self.last_placed = c
        self.placing.add(c)
        # only this client's own suspects: the master leaves its own out of placements (or
        # places them only when too few others are healthy, and then so must we)
        c.place_msg = p.Place(want, self.nodes.own_suspects()[:MAX_EXCLUDE])
        c.step = PLACE
        self._ask_master(c, c.place_msg)

    def pump(self, chunks: list[Chunk], block: bool) -> None:
        """Move chunks on by the replies that arrived; ``block``: wait for one (or a deadline)."""
        live = [c for c in chunks if not c.done]
        if not live:
            return
        wait_ms = 0
        if block and not any(c.ep is not None and c.ep.has(c.rid) for c in live):
            wait_ms = max(0, int((min(c.until for c in live) - time.monotonic()) * 1000))
        Replies({c.ep for c in live if c.ep is not None}).read(
            wait_ms, live[0].rid if len(live) == 1 else 0)
        now = time.monotonic()
        for c in live:
            reply = c.ep.take(c.rid) if c.ep is not None else None
            if reply is not None:
                self._advance(c, reply)
            elif c.until <= now or (c.ep is not None and c.ep.refused is not None):
                self._advance(c, None)  # (a refused handshake: the slow path raises it)

    def _advance(self, c: Chunk, reply: Any) -> None:
        """The next step after ``reply`` (None: none came in time)."""
        if c.step == PLACE:
            placement = reply if isinstance(reply, p.Placement) else self._place(c, reply)
            self.nodes.heard(placement.suspects)
            self.placing.discard(c)
            n = len(c.blobs)
            if placement.n > n and self.last_placed is c:  # the rest serve the next chunks
                self.block = Block(placement, placement.first + n,
                                   time.monotonic() + placement.deadline_s / 3)
            self._send(c, placement, list(range(placement.first, placement.first + n)))
        elif c.step == ENQUEUE:
            if isinstance(reply, p.Committed) and c.commit:
                self._committed(c, reply)
            elif isinstance(reply, p.Stored) and not c.commit:
                c.stored_on, c.step = list(reply.nodes), DONE
            elif isinstance(reply, p.Unstored):
                self._unstored(c, reply)
            elif isinstance(reply, p.PutAlso):
                self._put_also(c, reply)
            else:
                self._enqueue_slowly(c, reply)

    @staticmethod
    def _committed(c: Chunk, reply: p.Committed) -> None:
        """Done; an item an earlier one's unique key stands for has that one's id."""
        if len(reply.firsts) == len(c.ids):
            c.ids = list(reply.firsts)
        c.step = DONE

    def _send(self, c: Chunk, placement: p.Placement, ids: list[int]) -> None:
        """The payloads to every placed node and the enqueue to the master, all at once."""
        c.placement, c.ids, c.step = placement, ids, ENQUEUE
        o = c.opts
        meta = p.ItemMeta([], c.queue, o.priority, time.time() + o.delay_s if o.delay_s else 0.0,
                          o.key, 0, "")  # kept by the nodes beside the blobs (a rebuild's)
        c.meta = meta
        failed = self.nodes.put_reported(placement.nodes, placement.grant, ids, c.blobs, c.crcs,
                                         meta)
        if failed:  # a node's send queue is full: do not wait for its report
            self._unstored(c, p.Unstored(failed, "cannot send to these data nodes"))
            return
        n = len(ids)
        c.enqueue_msg = p.Enqueue(c.queue, as_ids(ids), [len(b) for b in c.blobs], c.crcs,
                                  [o.priority] * n, [o.delay_s] * n, [o.key] * n, o.coalesce,
                                  self.master.call_id(), not c.commit, self.nodes.node_timeout_s,
                                  placement.grant, [o.unique_key] * n if o.unique_key else [],
                                  o.unique_for_s, o.unique_until_done, not o.create,
                                  [o.lease_s] * n if o.lease_s else [],
                                  as_ids(c.result_of), o.result_kind,
                                  as_ids(list(o.depends_on)), o.on_dependency_failure,
                                  c.result_leases)
        c.since = time.monotonic()
        self._send_enqueue(c)

    def _send_enqueue(self, c: Chunk) -> None:
        assert c.enqueue_msg is not None
        self._send_to(c, self.master.endpoint, c.enqueue_msg,
                      time.monotonic() + self.master.enqueue_wait_s(self.nodes.node_timeout_s))

    def _put_also(self, c: Chunk, reply: p.PutAlso) -> None:
        """Some placed nodes were slow to store the chunk: put it on the nodes the master
        added as well, then ask for the same enqueue again (see the module docstring)."""
        assert c.meta is not None
        log.info("data nodes %s are slow to store; putting on %s as well", reply.slow,
                 [ref.node_id for ref in reply.nodes])
        self.nodes.suspect(reply.slow, SLOW_S)
        self.nodes.heard(reply.suspects)
        failed = self.nodes.put_reported(reply.nodes, reply.grant, c.ids, c.blobs, c.crcs, c.meta)
        if failed:
            self._unstored(c, p.Unstored(failed, "cannot send to these data nodes"))
            return
        self._send_enqueue(c)

    def _ask_master(self, c: Chunk, msg: Any) -> None:
        c.since = time.monotonic()
        self._send_to(c, self.master.endpoint, msg, c.since + self.master.attempt_s)

    @staticmethod
    def _send_to(c: Chunk, ep: Endpoint, msg: Any, until: float) -> None:
        try:
            c.ep, c.rid, c.until = ep, ep.send(msg), until
        except TimeoutError:  # the send queue is full: overdue at the next pump
            c.ep, c.until = None, 0.0

    # -- the slow ways -----------------------------------------------------------------------

    def _place(self, c: Chunk, reply: Any) -> p.Placement:
        """A placement after the place failed or went unanswered (see the module docstring)."""
        assert c.place_msg is not None
        if not isinstance(reply, p.Error) or is_retryable(reply):
            reply = self.master.call_many([c.place_msg], raise_errors=False, since=c.since)[0]
        if c.place_msg.exclude and isinstance(reply, p.Error) \
                and reply.code == NotEnoughDatanodes.code:
            reply = self.master.call_many([p.replace(c.place_msg, exclude=[])],
                                          raise_errors=False)[0]
        placement: p.Placement = raise_if_error(reply)
        return placement

    def _again(self, c: Chunk, error: Exception) -> None:
        """Enqueue the chunk again under fresh ids, or give up with ``error``."""
        c.failures += 1
        if c.failures >= PUT_ATTEMPTS:
            raise error
        self.block = None  # its ids may be the forgotten or badly placed ones
        c.placement, c.ids = None, []
        self.start(c)

    def _unstored(self, c: Chunk, reply: p.Unstored) -> None:
        # Only the latest culprits are avoided: a node that was merely slow is fine again
        # next time, and excluding too many fails the placement.
        log.warning("enqueue not stored (%s); placing it again without %s", reply.error,
                    reply.nodes)
        self.nodes.suspect(reply.nodes)
        error_type = DatanodeUnavailable if reply.nodes else NotEnoughDatanodes
        self._again(c, error_type(f"data nodes {reply.nodes} did not store the items: "
                                  f"{reply.error}"))

    def _enqueue_slowly(self, c: Chunk, reply: Any) -> None:
        assert c.enqueue_msg is not None
        try:
            if not isinstance(reply, p.Error) or is_retryable(reply):
                # applied at most once; the extra time is the master's wait for reports
                reply = self.master.call_many([c.enqueue_msg], extra_s=c.enqueue_msg.wait_s,
                                              raise_errors=False, since=c.since)[0]
            if isinstance(reply, p.Unstored):
                self._unstored(c, reply)
                return
            if isinstance(reply, p.PutAlso):  # not done: the copies asked for, then again
                self._put_also(c, reply)
                return
            raise_if_error(reply)
            if isinstance(reply, p.Stored):
                c.stored_on = list(reply.nodes)
            elif isinstance(reply, p.Committed):
                self._committed(c, reply)
            else:
                raise ProtocolError(f"an enqueue was answered {p.op_name(reply)}")
            c.step = DONE
        except UnknownItem as exc:
            log.warning("the master forgot the ids of a chunk of %d items (restarted?); "
                        "enqueueing it again", len(c.blobs))
            self._again(c, exc)


def staged_chunk(chunk: Chunk) -> tuple[list[int], list[str], list[p.PutGrant]]:
    """What ``commit`` needs of a staged chunk: its ids, the nodes that hold them, its grant."""
    grant = chunk.placement.grant if chunk.placement is not None else None
    return chunk.ids, chunk.stored_on, [grant] if grant is not None else []


class Window:
    """Chunks in the order they were added, at most ``size`` of them not done at once."""

    def __init__(self, pipeline: EnqueuePipeline, size: int) -> None:
        self.pipeline = pipeline
        self.size = max(1, size)
        self.chunks: list[Chunk] = []
        self.live: list[Chunk] = []

    def add(self, chunk: Chunk) -> None:
        """Start ``chunk``, first waiting while ``size`` chunks are in flight."""
        while len(self.live) >= self.size:
            self._pump(block=True)
        self.pipeline.start(chunk)
        self.chunks.append(chunk)
        self.live.append(chunk)
        self._pump(block=False)

    def wait(self) -> list[Chunk]:
        """Every chunk added so far, once all are done (the window is empty again)."""
        while self.live:
            self._pump(block=True)
        done, self.chunks = self.chunks, []
        return done

    def _pump(self, block: bool) -> None:
        self.pipeline.pump(self.live, block)
        self.live = [c for c in self.live if not c.done]
