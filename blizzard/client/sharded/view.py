"""What a sharded client knows of each shard's head of a queue, and the feed that tells it.

Relaxed priority order (the paper in ``docs/design.md``, "Sharded queues"): a consumer leases
from the shard whose head is best among those it looks at. ``HeadsView`` holds the heads it
has learnt, each with when it learnt it, from three sources: ``Head`` replies (peek-d), lease
replies (``Lease.head``: the shard's head right after this client's own lease) and the heads
the masters publish (``HeadsFeed``: a ZeroMQ SUB socket on every shard's ``--heads-bind``).
A head older than ``STALE_S`` is not trusted: a master republishes all its heads every second,
so an older one means its shard is down or cut off, and its items wait for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import zmq

from blizzard.net.keys import ClientKeys
from blizzard.net.secure import connect_curve
from blizzard.wire import protocol as p
from blizzard.wire.errors import ClientClosed
from blizzard.wire.shard_messages import topic

log = logging.getLogger(__name__)

STALE_S = 3.0  # a head learnt longer ago than this is not trusted (masters republish every 1 s)
FEED_BYTES = 4096  # a published head is under 300 bytes; anything bigger is not one


def order(head: p.QueueHead) -> tuple[int, float]:
    """The serving order of heads across shards: priority, then the earlier enqueue."""
    return head.priority, head.enqueued_at


class HeadsView:
    """The newest head learnt of each (queue, shard), with the monotonic time it was learnt."""

    def __init__(self) -> None:
        self.heads: dict[str, dict[int, tuple[p.QueueHead, float]]] = {}

    def learn(self, head: p.QueueHead, mono: float | None = None) -> None:
        """Keep ``head`` unless a newer one (higher ``seq``) of its shard is known and fresh:
        a publication sent before a lease may arrive after that lease's reply."""
        mono = time.monotonic() if mono is None else mono
        shards = self.heads.setdefault(head.queue, {})
        known = shards.get(head.shard)
        if known is None or head.seq >= known[0].seq or mono - known[1] >= STALE_S:
            shards[head.shard] = (head, mono)

    def knows(self, queue: str, shards: int) -> bool:
        """Whether a fresh head of every shard is known."""
        return len(self.fresh(queue)) == shards

    def fresh(self, queue: str) -> dict[int, p.QueueHead]:
        now = time.monotonic()
        return {shard: head for shard, (head, at) in self.heads.get(queue, {}).items()
                if now - at < STALE_S}

    def best(self, queue: str, among: Sequence[int] | None = None,
             fresh: dict[int, p.QueueHead] | None = None) -> int | None:
        """The shard with the best fresh head holding ready items (``among`` those, if
        given; of ``fresh``, ``fresh(queue)`` taken already, if given); None if no fresh
        head holds any."""
        fresh = self.fresh(queue) if fresh is None else fresh
        ready = [(order(head), shard) for shard, head in fresh.items()
                 if head.ready > 0 and (among is None or shard in among)]
        return min(ready)[1] if ready else None

    def emptied(self, queue: str, shard: int) -> None:
        """A lease found shard ``shard`` empty: until news comes, it holds nothing ready."""
        known = self.heads.get(queue, {}).get(shard)
        self.learn(p.QueueHead(queue, shard, 0, 0, 0.0, known[0].seq if known else 0))


class HeadsFeed:
    """A SUB socket on every shard master's heads publisher, feeding a ``HeadsView``."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], view: HeadsView,
                 keys: ClientKeys | None) -> None:
        self.view = view
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, FEED_BYTES)
        self.sock.setsockopt(zmq.RCVHWM, 100_000)
        if keys is not None:
            assert keys.master is not None
            connect_curve(self.sock, keys, keys.master)
        self.connected: set[str] = set()
        self.topics: set[str] = set()
        self.closed = False

    def _open(self) -> zmq.Socket[bytes]:
        if self.closed:
            raise ClientClosed()
        return self.sock

    def connect(self, addr: str) -> None:
        if addr and addr not in self.connected:
            self._open().connect(addr)
            self.connected.add(addr)

    def subscribe(self, queue: str) -> None:
        if queue not in self.topics:
            self._open().setsockopt(zmq.SUBSCRIBE, topic(queue))
            self.topics.add(queue)

    def drain(self, limit: int = 100_000) -> int:
        """Take every published head that has arrived (without waiting); how many."""
        got = 0
        mono = time.monotonic()
        sock = self._open()
        while got < limit:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            got += 1
            try:
                head = p.unpack(frames[-1])
            except Exception:  # not from a master of ours: ignored
                continue
            if isinstance(head, p.QueueHead) and frames[0] == topic(head.queue):
                self.view.learn(head, mono)
        return got

    def wait(self, timeout_ms: int) -> None:
        """Wait up to ``timeout_ms`` for a published head to arrive."""
        self._open().poll(timeout_ms)

    def close(self) -> None:
        self.closed = True
        self.sock.close()
