"""The enqueue pipeline: chunks of items through alloc -> put -> commit, several in flight.

``Client.enqueue_many``, ``Client.stage`` and ``Producer`` all drive it. A chunk (at most
``CHUNK_ITEMS`` items and about ``CHUNK_BYTES``) moves on by one step per reply, without waiting
for the other chunks, so the round trips and fsyncs of the chunks in flight overlap. A chunk is
done once its commit is durable (or, for ``stage``, once its payloads are).

When a step goes wrong the chunk is helped along synchronously, then moves on as before:

- an alloc not answered in ``ATTEMPT_S``, or answered "master starting", is sent again with
  back-off until ``timeout_s``; where avoiding suspected nodes leaves too few for a placement,
  it is asked for again without avoiding them (a suspect is better than no write at all);
- a put that fails or times out makes its culprits suspected and asks for a placement
  without them (too few nodes without them is an error), ``PUT_ATTEMPTS`` puts in all;
- a commit not answered in time is sent again under its request id, so a commit that
  landed is applied once; a commit the master does not know (it restarted between alloc and
  commit, so nothing of the chunk is visible) stages the chunk again, ``PUT_ATTEMPTS`` in all.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import zlib
from dataclasses import dataclass
from typing import Any, Iterable

from blizzard import protocol as p
from blizzard.datanodes import DatanodePool, PutFailed
from blizzard.enqueue_options import EnqueueOptions, as_bytes
from blizzard.errors import NotEnoughDatanodes, UnknownItem
from blizzard.master_link import ATTEMPT_S, MasterLink, is_retryable
from blizzard.transport import Endpoint, Replies, raise_if_error

log = logging.getLogger(__name__)

CHUNK_ITEMS = 1000  # items per alloc/put/commit
CHUNK_BYTES = 16 * 1024 * 1024
PUT_ATTEMPTS = 4
ENQUEUE_WINDOW = 8  # chunks in flight for one enqueue_many or stage call

ALLOC, PUT, COMMIT, DONE = range(4)

Staged = list[tuple[list[int], list[str]]]  # (ids, node ids) per chunk, for commit()


@dataclass(eq=False)
class Chunk:
    """Items on their way into a queue, and the step they are at."""

    queue: str
    blobs: list[bytes]
    crcs: list[int]
    opts: EnqueueOptions
    commit: bool  # False: done once stored (Client.stage)
    step: int = ALLOC
    alloc: p.Alloc | None = None
    placement: p.Placement | None = None
    stored_on: list[str] = dataclasses.field(default_factory=list)
    commit_msg: p.Commit | None = None
    put_failures: int = 0
    restaged: int = 0
    ep: Endpoint | None = None  # where the step's request went (None: it could not be sent)
    rid: int = 0
    until: float = 0.0  # monotonic time the reply is overdue
    since: float = 0.0  # monotonic time the current master step began: retries count from it

    @property
    def done(self) -> bool:
        return self.step == DONE

    @property
    def ids(self) -> list[int]:
        return list(self.placement.ids) if self.placement is not None else []


def split(items: Iterable[Any]) -> list[list[bytes]]:
    """Payloads as bytes, cut into chunks of at most CHUNK_ITEMS items and about CHUNK_BYTES."""
    chunks: list[list[bytes]] = [[]]
    size = 0
    for blob in map(as_bytes, items):
        if len(chunks[-1]) >= CHUNK_ITEMS or (size + len(blob) > CHUNK_BYTES and chunks[-1]):
            chunks.append([])
            size = 0
        chunks[-1].append(blob)
        size += len(blob)
    return chunks if chunks[0] else []


class EnqueuePipeline:
    """Moves chunks through alloc -> put -> commit over the master link and the data-node pool."""

    def __init__(self, master: MasterLink, nodes: DatanodePool) -> None:
        self.master = master
        self.nodes = nodes

    def chunks(self, queue: str, items: Iterable[Any], opts: EnqueueOptions, *,
               commit: bool = True) -> list[Chunk]:
        """``items`` cut into chunks, not started yet (a payload that is not bytes fails here)."""
        return [Chunk(queue, blobs, [zlib.crc32(b) for b in blobs], opts, commit)
                for blobs in split(items)]

    def enqueue(self, queue: str, items: Iterable[Any], opts: EnqueueOptions) -> list[int]:
        """Every item committed, in order; their ids."""
        window = Window(self, ENQUEUE_WINDOW)
        for chunk in self.chunks(queue, items, opts):
            window.add(chunk)
        return [i for chunk in window.wait() for i in chunk.ids]

    def stage(self, queue: str, items: Iterable[Any], opts: EnqueueOptions) -> Staged:
        """Every item stored durably but not committed; (ids, node ids) per chunk."""
        window = Window(self, ENQUEUE_WINDOW)
        for chunk in self.chunks(queue, items, opts, commit=False):
            window.add(chunk)
        return [(chunk.ids, chunk.stored_on) for chunk in window.wait()]

    def commit(self, staged: Staged) -> None:
        """Make staged chunks visible, all in one round trip (idempotent)."""
        if staged:
            self.master.call_many([p.Commit(ids, nodes, self.master.call_id())
                                   for ids, nodes in staged])

    # -- the steps ---------------------------------------------------------------------------

    def start(self, c: Chunk) -> None:
        """Ask for the chunk's ids and a placement that avoids the nodes suspected now."""
        n, o = len(c.blobs), c.opts
        c.alloc = p.Alloc(c.queue, [len(b) for b in c.blobs], c.crcs, [o.priority] * n,
                          [o.delay_s] * n, [o.key] * n, o.coalesce, self.nodes.suspected())
        c.step, c.put_failures = ALLOC, 0
        self._ask_master(c, c.alloc)

    def pump(self, chunks: list[Chunk], block: bool) -> None:
        """Move chunks on by the replies that arrived; ``block``: wait for one (or a deadline)."""
        live = [c for c in chunks if not c.done]
        if not live:
            return
        wait_ms = 0
        if block and not any(c.ep is not None and c.rid in c.ep.received() for c in live):
            wait_ms = max(0, int((min(c.until for c in live) - time.monotonic()) * 1000))
        Replies({c.ep for c in live if c.ep is not None}).read(wait_ms)
        now = time.monotonic()
        for c in live:
            reply = c.ep.take(c.rid) if c.ep is not None else None
            if reply is not None:
                self._advance(c, reply)
            elif c.until <= now:
                self._advance(c, None)

    def _advance(self, c: Chunk, reply: Any) -> None:
        """The next step after ``reply`` (None: none came in time)."""
        if c.step == ALLOC:
            self._put(c, reply if isinstance(reply, p.Placement) else self._place(c, reply))
        elif c.step == PUT:
            assert c.placement is not None
            if reply is None:
                addr = c.placement.nodes[0].addr
                reply = TimeoutError(f"no reply from {addr} within {self.nodes.node_timeout_s:g}s")
            outcome = self.nodes.put_outcome(c.placement, reply)
            if isinstance(outcome, p.Stored):
                self._stored(c, outcome)
            else:
                self._put_failed(c, outcome)
        elif c.step == COMMIT:
            if isinstance(reply, p.Committed):
                c.step = DONE
            else:
                self._commit_slowly(c, reply)

    def _put(self, c: Chunk, placement: p.Placement) -> None:
        c.placement, c.step = placement, PUT
        ep, put = self.nodes.put_request(placement, c.blobs, c.crcs)
        self._send(c, ep, put, time.monotonic() + self.nodes.node_timeout_s)

    def _stored(self, c: Chunk, stored: p.Stored) -> None:
        assert c.placement is not None
        c.stored_on = list(stored.nodes)
        if not c.commit:
            c.step = DONE
            return
        c.commit_msg = p.Commit(c.placement.ids, c.stored_on, self.master.call_id())
        c.step = COMMIT
        self._ask_master(c, c.commit_msg)

    def _ask_master(self, c: Chunk, msg: Any) -> None:
        c.since = time.monotonic()
        self._send(c, self.master.endpoint, msg, c.since + ATTEMPT_S)

    @staticmethod
    def _send(c: Chunk, ep: Endpoint, msg: Any, until: float) -> None:
        try:
            c.ep, c.rid, c.until = ep, ep.send(msg), until
        except TimeoutError:  # the send queue is full: overdue at the next pump
            c.ep, c.until = None, 0.0

    # -- the slow ways -----------------------------------------------------------------------

    def _place(self, c: Chunk, reply: Any) -> p.Placement:
        """A placement after the alloc failed or went unanswered (see the module docstring)."""
        assert c.alloc is not None
        if not isinstance(reply, p.Error) or is_retryable(reply):
            reply = self.master.call_many([c.alloc], raise_errors=False, since=c.since)[0]
        if c.alloc.exclude and isinstance(reply, p.Error) and reply.code == NotEnoughDatanodes.code:
            reply = self.master.call_many([dataclasses.replace(c.alloc, exclude=[])],
                                          raise_errors=False)[0]
        return raise_if_error(reply)

    def _put_failed(self, c: Chunk, failed: PutFailed) -> None:
        c.put_failures += 1
        if c.put_failures >= PUT_ATTEMPTS:
            raise failed.error
        # Only the latest culprits are avoided: a node that merely waited on a dead replica is
        # fine again next time, and excluding too many fails the placement.
        log.warning("put failed (%s); asking for a placement without %s", failed.error,
                    sorted(failed.avoid))
        self.nodes.suspect(failed.avoid)
        assert c.alloc is not None
        c.alloc = dataclasses.replace(c.alloc, exclude=sorted(failed.avoid))
        self._put(c, self.master.call(c.alloc))  # too few nodes without them: an error

    def _commit_slowly(self, c: Chunk, reply: Any) -> None:
        assert c.commit_msg is not None
        try:
            if not isinstance(reply, p.Error) or is_retryable(reply):
                reply = self.master.call(c.commit_msg, since=c.since)  # applied at most once
            raise_if_error(reply)
            c.step = DONE
        except UnknownItem:
            c.restaged += 1
            if c.restaged >= PUT_ATTEMPTS:
                raise
            log.warning("the master forgot a pending chunk of %d items (restarted?); staging it "
                        "again", len(c.blobs))
            self.start(c)


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
