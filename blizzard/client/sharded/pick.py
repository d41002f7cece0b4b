"""Which shard a sharded client leases from: relaxed priority order over independent masters.

Each shard is a whole cluster holding part of every queue, in its own strict order. A lease
goes to one shard, the one whose head is best (lowest priority, then earliest enqueued) among
those looked at:

- peek-d (the paper's rule, ``heads=False``): ask ``d`` shards drawn at random for their head
  (``Head``, one round in parallel), lease from the best. ``d`` = the number of shards gives
  strict order at the cost of asking every shard each time.
- published heads (``heads=True``, the default): every master publishes its queues' heads as
  they change (``master/shard/heads.py``) and the client keeps them
  (``blizzard/client/sharded/view.py``), so it leases from the best shard it knows of with no
  question asked first; each lease reply also brings that shard's new head. Information is a little
  stale; a lease that finds the shard empty marks it so and tries the next best.

A shard that does not answer is left alone for ``DOWN_S``: its items wait for it, the others
keep serving.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from blizzard.client.sharded.view import HeadsFeed, HeadsView, order
from blizzard.net.transport import call_many
from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument, MasterStarting, MasterUnavailable, NotPrimary

PEEK_TIMEOUT_S = 1.0  # a shard that does not tell its head within this is skipped
DOWN_S = 2.0  # and not asked again for this long
WAIT_SLICE_S = 0.2  # with nothing ready anywhere, a long poll waits on one shard this long
STICKY_S = 1.0  # FIFO between shards may be relaxed this much to keep a consumer on its shard
LEASE_ATTEMPT_S = 3.0  # a shard that does not answer a lease within this is left for another
# what a shard says while it cannot serve for now (dead, rebuilding, a standby not yet
# promoted): that shard is passed over for ``DOWN_S``, the others keep serving
UNAVAILABLE = (MasterUnavailable, MasterStarting, NotPrimary)
EMPTY = p.Leased("", [], [], [], [], [], [], [], [], [], [], [],
                 p.GetGrant([], [], 0, 0.0, b""), [])


class ShardPicker:
    """Chooses the shard for each lease and leases there (``lease``)."""

    def __init__(self, shards: Sequence[Any], peeks: int, feed: HeadsFeed | None,
                 view: HeadsView, hello: Callable[[int], None]) -> None:
        if type(peeks) is not int or peeks < 1:
            raise InvalidArgument(f"peeks must be a positive integer, got {peeks!r}")
        self.shards = shards  # a ``Client`` per shard
        self.peeks = min(peeks, len(shards))
        self.feed = feed
        self.view = view
        self.hello = hello  # checks shard k is what it claims (once), before it is used
        self.down: dict[int, float] = {}  # shard -> monotonic time it may be asked again
        self.feedless: set[int] = set()  # shards that publish no heads: asked each time
        self.rng = random.Random()
        self.turn = 0
        self.requests = 0  # Head and Lease requests sent (what a pop costs, for bench-pei)

    def is_down(self, k: int) -> bool:
        return self.down.get(k, 0.0) > time.monotonic()

    def up(self) -> list[int]:
        now = time.monotonic()
        return [k for k in range(len(self.shards)) if self.down.get(k, 0.0) <= now]

    def lease(self, queue: str, n: int, lease_s: float | None, wait_s: float,
              prefer: int | None = None, riding: Sequence[Any] = ()) -> tuple[int, p.Leased, bool]:
        """Lease up to ``n`` items of ``queue`` from the best shard; (shard, reply, whether
        ``riding`` rode on it). Waits up to ``wait_s`` while no shard has any ready.

        ``riding``: acks for shard ``prefer``, settled with the lease if it goes there. Among
        heads of equal priority enqueued within ``STICKY_S`` of each other, ``prefer`` is
        taken (the published heads only): a consumer's acks then ride on its next lease, and
        FIFO between shards is relaxed by at most that much.
        """
        deadline = time.monotonic() + wait_s
        tried: set[int] = set()
        acked = False
        final = self.feed is None  # peek-d asks afresh each time: no last round needed
        while True:
            k = self.choose(queue, tried, prefer)
            if k is None and time.monotonic() < deadline:
                k, waited = self._wait(queue, n, lease_s, deadline)
                if waited is not None and waited.ids:
                    return k, waited, acked
                tried.clear()
                continue
            if k is None:
                up = self.up()
                if not up:
                    raise MasterUnavailable(f"none of the {len(self.shards)} shards' masters "
                                            "answered")
                if final:
                    return up[0], EMPTY, acked
                # Nothing ready as far as the heads known say; they may lag (a publication
                # still on its way): before answering "empty", ask every shard once.
                final = True
                tried.clear()
                ready = [(order(head), shard) for shard, head in self.peek(queue, up).items()
                         if head.ready > 0]
                if not ready:
                    return up[0], EMPTY, acked
                k = min(ready)[1]
            rides = riding if not acked and k == prefer else ()
            leased = self._lease(k, queue, n, lease_s, 0.0, rides)
            acked = acked or bool(rides) and leased is not EMPTY  # settled with the lease
            if leased.ids:
                return k, leased, acked
            self.view.emptied(queue, k)
            tried.add(k)

    def choose(self, queue: str, tried: set[int], prefer: int | None = None) -> int | None:
        """The shard to lease from: the best head among those looked at (not yet ``tried``;
        ``prefer`` on a near tie); None if none of them has items ready."""
        up = [k for k in self.up() if k not in tried]
        if not up:
            return None
        if self.feed is not None:
            self.feed.subscribe(queue)
            self.feed.drain()
            fresh = self.view.fresh(queue)
            unknown = [k for k in up if k not in fresh or k in self.feedless]
            if unknown:  # never heard of (or silent): ask once, the feed keeps it current
                self.peek(queue, unknown)
            heads = self.view.fresh(queue)
            best = self.view.best(queue, up, heads)
            if best is not None and prefer is not None and prefer in up and prefer != best:
                mine, top = heads.get(prefer), heads[best]
                if mine is not None and mine.ready > 0 and mine.priority == top.priority \
                        and mine.enqueued_at - top.enqueued_at <= STICKY_S:
                    return prefer
            return best
        sample = self.rng.sample(up, min(self.peeks, len(up)))
        heads = self.peek(queue, sample)
        ready = [(order(head), k) for k, head in heads.items() if head.ready > 0]
        if not ready and len(sample) < len(up):  # the sample is empty: look at the rest
            rest = [k for k in up if k not in sample]
            heads = self.peek(queue, rest)
            ready = [(order(head), k) for k, head in heads.items() if head.ready > 0]
        return min(ready)[1] if ready else None

    def peek(self, queue: str, shards: Sequence[int]) -> dict[int, p.QueueHead]:
        """The heads of ``queue`` on ``shards``, asked in one parallel round; a shard that
        does not answer is marked down."""
        shards = [k for k in shards if self._greeted(k)]
        links = [self.shards[k].master for k in shards]
        replies = call_many([(link.endpoint, p.Head(queue)) for link in links], PEEK_TIMEOUT_S)
        self.requests += len(shards)
        heads: dict[int, p.QueueHead] = {}
        mono = time.monotonic()
        for k, link, reply in zip(shards, links, replies, strict=True):
            if isinstance(reply, p.QueueHead) and reply.shard == k:
                heads[k] = reply
                self.view.learn(reply, mono)
            else:  # silent, starting, a standby, or not this shard: ask it again later
                self.down[k] = mono + DOWN_S
                link.move_on(reply)
        return heads

    def _greeted(self, k: int) -> bool:
        """``hello(k)``; False (and shard ``k`` marked down) if it did not answer."""
        try:
            self.hello(k)
            return True
        except UNAVAILABLE:
            self.down[k] = time.monotonic() + DOWN_S
            return False

    def _lease(self, k: int, queue: str, n: int, lease_s: float | None, wait_s: float,
               ack: Sequence[Any] = ()) -> p.Leased:
        """Lease on shard ``k`` (``ack`` riding on it). One that does not answer within
        ``LEASE_ATTEMPT_S`` (plus the wait) is marked down and the lease comes back as
        ``EMPTY``, so the caller turns to another shard: a dead shard stalls only its own
        items."""
        self.requests += 1
        try:
            self.hello(k)
            leased: p.Leased = self.shards[k].leases.lease_columns(
                queue, n, lease_s=lease_s, wait_s=wait_s, ack=ack, head=True,
                timeout_s=min(LEASE_ATTEMPT_S, self.shards[k].timeout_s))
        except UNAVAILABLE:
            self.down[k] = time.monotonic() + DOWN_S
            return EMPTY
        if leased.head_ready >= 0:
            self.view.learn(p.QueueHead(queue, k, leased.head_ready, leased.head_priority,
                                        leased.head_at, leased.head_seq))
        return leased

    def _wait(self, queue: str, n: int, lease_s: float | None,
              deadline: float) -> tuple[int, p.Leased | None]:
        """Nothing ready anywhere: wait for news (a published head) or, without the feed,
        long-poll the shards in turn, a slice each."""
        slice_s = max(0.0, min(WAIT_SLICE_S, deadline - time.monotonic()))
        if self.feed is not None:
            self.feed.wait(int(slice_s * 1000) + 1)
            return -1, None
        up = self.up() or list(range(len(self.shards)))
        k = up[self.turn % len(up)]
        self.turn += 1
        return k, self._lease(k, queue, n, lease_s, slice_s)
