"""A sharded master's side of relaxed ordering: its shard's ids, and its queues' heads.

Shard ``k`` hands out ids from ``k << 56`` on (``blizzard/wire/shard_messages.py``), so an id names
the shard that holds it and every shard's ids differ; ``claim_shard`` starts a fresh master
there and refuses a data dir that holds another shard's ids.

A queue's head on this shard (``head_of``: what a lease would take first) is what a sharded
client compares shards by. It is asked for with ``Head`` (the paper's peek-d), comes back on a
lease that asks (``Lease.head``), and, with ``--heads-bind``, is published on a ZeroMQ XPUB
socket whenever it changes (``Heads.publish``), so a client that subscribes knows every shard's
head, a little stale, without asking any. Only queues someone subscribes to are published
(producers alone pay nothing for the feed), and a new subscriber is sent the head at once.
With keys, the feed admits client and admin keys only (``blizzard/net/secure.py``: its ZAP domain
names the roles), so a data node's key cannot read the queues' heads. Subscriptions are
capped per connection and in all, and forgotten when their connection goes
(``master/shard/subscribers.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, cast

import zmq

from blizzard.net.keys import READERS, ServerKeys
from blizzard.net.secure import serve_curve
from blizzard.server.conn_guard import GuardDepartures, guarded
from blizzard.server.departures import cut, source_fd
from blizzard.server.router import SERVER_HANDSHAKE_IVL_MS
from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument
from blizzard.wire.shard_messages import first_id, shard_of, topic
from master.rules import arguments
from master.shard.subscribers import CUT, MAX_MESSAGE_BYTES, OK, Subscribers
from master.state.machine import State

_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)  # plain ints: enum operators cost a call

log = logging.getLogger(__name__)

SCAN_EVERY_S = 0.001  # heads are compared at most this often (after a pass that did something)
REPUBLISH_S = 1.0  # and all of them sent again this often, for subscribers that joined late
MAX_SCAN = 256  # queues compared per scan (more: in turns)


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
    if q is None or not ids:
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
        self.listened = Subscribers()  # who subscribes to which topics
        self.departures: GuardDepartures | None = None
        self.port = 0
        if bind:
            sock = ctx.socket(zmq.XPUB)  # tells the master which queues anyone listens to
            sock.setsockopt(zmq.LINGER, 0)
            # a subscriber sends only topics: a bigger message ends its connection
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
            sock.setsockopt(zmq.SNDHWM, 10_000)  # a slow subscriber loses updates, not memory
            sock.setsockopt(zmq.XPUB_MANUAL, 1)  # the master applies each subscription itself
            # a connection not through its handshake by then is cut (and pends till then)
            sock.setsockopt(zmq.HANDSHAKE_IVL, SERVER_HANDSHAKE_IVL_MS)
            if keys is not None:  # producers' and consumers' keys: not a data node's
                serve_curve(sock, keys, READERS)
            sock.bind(bind)
            self.sock = sock
            # blizzard/server/conn_guard.py: caps; a subscription read proves its connection
            self.departures = guarded(sock)
            endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            self.port = int(endpoint.rsplit(":", 1)[1]) if endpoint.startswith("tcp") else 0

    def wake(self) -> float | None:
        """When the loop must pass again to publish a change (monotonic); None: no change."""
        return self.next_scan if self.dirty and self.listened else None

    def next_round(self) -> float | None:
        """When every listened-to head is sent again (monotonic); None: none is."""
        return self.next_all if self.listened else None

    def head(self, msg: p.Head, now: float, *_: Any) -> p.QueueHead:
        arguments.queue_name(msg.queue)
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
        listened = self.listened.listened
        everyone = listened(b"")  # a subscription to every topic
        for name in names:
            if everyone or listened(topic(name)):
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
        """Read the (un)subscriptions that came, apply those ``Subscribers`` admits, then
        forget the subscriptions of connections that left; the queues just joined.

        In manual mode libzmq passes on every (un)subscription, and applies none itself: a
        subscription applied here (``subscribe``) is the one just read. Unsubscriptions
        libzmq makes for a connection that left carry no descriptor and are skipped: its
        departure (read after its last messages) says the same.
        """
        assert self.sock is not None and self.departures is not None
        sock, listened = self.sock, self.listened
        joined: list[str] = []
        proven: set[int] = set()
        while cast(int, sock.get(_EVENTS)) & _POLLIN:  # EVENTS is an int option
            try:
                frame = sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            msg, fd = frame.bytes, source_fd(frame)
            if not msg or msg[0] not in (0, 1) or fd < 0 or self.departures.departed(fd):
                continue  # not a subscription, or a departed connection's
            proven.add(fd)
            wanted = msg[1:]
            if msg[0] == 0:
                if listened.unsubscribe(fd, wanted):
                    sock.unsubscribe(wanted)
                continue
            exists = not wanted or wanted[:-1].decode("ascii", "replace") in self.state.queues
            verdict = listened.subscribe(fd, wanted, exists)
            if verdict == OK:
                sock.subscribe(wanted)  # to the connection this came on
                if wanted:
                    joined.append(wanted[:-1].decode("ascii"))
                else:
                    joined += list(self.state.queues)[:MAX_SCAN]
            elif verdict == CUT:
                listened.cutting(fd)
                cut(fd, self.port)
        if proven:
            self.departures.established(proven)
        for fd in self.departures.read():
            listened.gone(fd)
        return joined

    def _send(self, head: p.QueueHead) -> None:
        assert self.sock is not None
        try:
            self.sock.send_multipart([topic(head.queue), p.pack(head)], zmq.NOBLOCK)
        except zmq.Again:  # PUB drops rather than blocks; a full queue is no reason to stop
            pass

    def close(self) -> None:
        if self.departures is not None:
            self.departures.close()  # before its socket (see Departures)
        if self.sock is not None:
            self.sock.close()
