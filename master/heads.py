"""A sharded master's side of relaxed ordering: its shard's ids, and its queues' heads.

Shard ``k`` hands out ids from ``k << 56`` on (``blizzard/shard_messages.py``), so an id names
the shard that holds it and every shard's ids differ; ``claim_shard`` starts a fresh master
there and refuses a data dir that holds another shard's ids.

A queue's head on this shard (``head_of``: what a lease would take first) is what a sharded
client compares shards by. It is asked for with ``Head`` (the paper's peek-d), comes back on a
lease that asks (``Lease.head``), and, with ``--heads-bind``, is published on a ZeroMQ XPUB
socket whenever it changes (``Heads.publish``), so a client that subscribes knows every shard's
head, a little stale, without asking any. Only queues someone subscribes to are published
(producers alone pay nothing for the feed), and a new subscriber is sent the head at once.
With keys, the feed admits client and admin keys only (``blizzard/secure.py``: its ZAP domain
names the roles), so a data node's key cannot read the queues' heads.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import zmq

from blizzard import protocol as p
from blizzard.errors import InvalidArgument
from blizzard.keys import READERS, ServerKeys
from blizzard.secure import serve_curve
from blizzard.shard_messages import first_id, shard_of, topic
from master import checks
from master.state import State

_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)  # plain ints: enum operators cost a call

log = logging.getLogger(__name__)

SCAN_EVERY_S = 0.001  # heads are compared at most this often (after a pass that did something)
REPUBLISH_S = 1.0  # and all of them sent again this often, for subscribers that joined late
MAX_SCAN = 256  # queues compared per scan (more: in turns)
SUBSCRIPTION_BYTES = 1024  # a subscriber sends only topics; anything bigger is dropped


def claim_shard(state: State, shard: int) -> None:
    """Start a fresh master's ids at its shard's first id; refuse a log of another shard's.

    Nothing is logged: the first placement's ``Reserve`` record carries the range.
    """
    if state.id_hi <= 1:
        state.id_hi = first_id(shard)
    elif shard_of(state.id_hi) != shard:  # the next id to hand out: in its shard's range
        raise InvalidArgument(f"this data dir holds the ids of shard {shard_of(state.id_hi)}, "
                              f"not of shard {shard} (--shard must stay what it was)")


def head_of(state: State, queue: str, shard: int, now: float, seq: int) -> p.QueueHead:
    """``queue``'s head on this shard: how many items are ready, and the first one's order."""
    q = state.queues.get(queue)
    ids = state.head(queue, 1, now) if q is not None and q.n_ready else []
    if not ids:
        return p.QueueHead(queue, shard, 0, 0, 0.0, seq)
    item = state.items[ids[0]]
    return p.QueueHead(queue, shard, q.n_ready, item.priority, item.enqueued_at, seq)


class Heads:
    """The ``Head`` request, and the publisher when the master was given ``--heads-bind``."""

    def __init__(self, state: State, shard: int, ctx: zmq.Context, bind: str | None,
                 keys: ServerKeys | None, records: Callable[[], int]) -> None:
        self.state = state
        # A head's ``seq`` orders what a client hears of it (a lease reply may overtake an
        # older publication): microseconds at start plus records logged since, which rises
        # across restarts too while the master logs under a million records a second.
        self.boot_us = int(time.time() * 1e6)
        self.records = records
        self.shard = shard
        self.sock: zmq.Socket | None = None
        self.published: dict[str, tuple[int, int, float]] = {}  # queue -> (ready?, prio, at)
        self.turn = 0
        self.next_scan = 0.0
        self.next_all = 0.0
        self.dirty = False  # something changed since the last scan
        self.marks: dict[str, tuple[int, int, int, int]] = {}  # queue -> counts at its last scan
        self.listened: set[bytes] = set()  # topics someone subscribes to
        if bind:
            sock = ctx.socket(zmq.XPUB)  # tells the master which queues anyone listens to
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, SUBSCRIPTION_BYTES)  # a subscription's size
            sock.setsockopt(zmq.SNDHWM, 10_000)  # a slow subscriber loses updates, not memory
            if keys is not None:  # producers' and consumers' keys: not a data node's
                serve_curve(sock, keys, READERS)
            sock.bind(bind)
            self.sock = sock

    def wake(self) -> float | None:
        """When the loop must pass again to publish a change (monotonic); None: no change."""
        return self.next_scan if self.dirty and self.listened else None

    def next_round(self) -> float | None:
        """When every listened-to head is sent again (monotonic); None: none is."""
        return self.next_all if self.listened else None

    def head(self, msg: p.Head, now: float, *_: Any) -> p.QueueHead:
        checks.queue_name(msg.queue)
        return head_of(self.state, msg.queue, self.shard, now, self.seq())

    def seq(self) -> int:
        return self.boot_us + self.records()

    def publish(self, busy: bool, mono: float) -> None:
        """After a pass: send the heads that changed (``busy``: the pass did something; a
        change within ``SCAN_EVERY_S`` of the last scan waits for the next, ``wake``), or
        every head once a second; only of queues someone subscribes to, and a queue's head
        at once to its first subscriber."""
        if self.sock is None:
            return
        joined = self._listeners()
        self.dirty = self.dirty or busy
        if not self.listened:
            self.dirty = False
            return  # nobody listens: producers alone pay nothing for the feed
        everything = mono >= self.next_all
        scan = self.dirty and mono >= self.next_scan or everything
        if not (joined or scan):
            return
        now, seq = time.time(), self.seq()
        for name in joined:
            self._publish(name, now, seq, True)
        if not scan:
            return
        self.dirty = False
        self.next_scan = mono + SCAN_EVERY_S
        if everything:
            self.next_all = mono + REPUBLISH_S
            for gone in [name for name in self.published if name not in self.state.queues]:
                del self.published[gone]  # a deleted queue
                self.marks.pop(gone, None)
        names = list(self.state.queues)
        if len(names) > MAX_SCAN:
            start = self.turn % len(names)
            names = (names[start:] + names[:start])[:MAX_SCAN]
            self.turn = start + MAX_SCAN
        everyone = b"" in self.listened  # a subscription to every topic
        for name in names:
            if everyone or topic(name) in self.listened:
                self._publish(name, now, seq, everything)

    def _publish(self, name: str, now: float, seq: int, anyway: bool) -> None:
        """Send ``name``'s head if it changed since it was last sent (or ``anyway``)."""
        q = self.state.queues.get(name)
        if q is None:
            return
        # what every change of a head changes too: no head is worked out for a queue
        # untouched since the last scan (the once-a-second round works out all of them)
        mark = (q.n_ready, len(q.ready), q.n_delayed, q.n_leased)
        if not anyway and self.marks.get(name) == mark:
            return
        self.marks[name] = mark
        head = head_of(self.state, name, self.shard, now, seq)
        seen = (min(head.ready, 1), head.priority, head.enqueued_at)
        if anyway or self.published.get(name) != seen:
            self.published[name] = seen
            self._send(head)

    def _listeners(self) -> list[str]:
        """Read the subscriptions that came (the XPUB socket tells a topic's first subscribe
        and its last unsubscribe, a subscriber's leaving included); the queues just joined."""
        assert self.sock is not None
        joined = []
        while self.sock.get(_EVENTS) & _POLLIN:
            try:
                msg = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            if not msg or msg[0] not in (0, 1):
                continue  # not a subscription: ignored
            wanted = msg[1:]
            if msg[0] == 0:
                self.listened.discard(wanted)
                continue
            self.listened.add(wanted)
            if wanted.endswith(b"\0"):
                try:
                    joined.append(wanted[:-1].decode("utf-8"))
                except UnicodeDecodeError:
                    pass
            elif not wanted:
                joined += list(self.state.queues)[:MAX_SCAN]
        return joined

    def _send(self, head: p.QueueHead) -> None:
        assert self.sock is not None
        try:
            self.sock.send_multipart([topic(head.queue), p.pack(head)], zmq.NOBLOCK)
        except zmq.Again:  # PUB drops rather than blocks; a full queue is no reason to stop
            pass

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
