"""Who listens to the heads feed: each connection's subscriptions, capped, gone when it goes.

A subscription costs the publisher memory (libzmq keeps every topic a subscriber sent, a
node per byte, until it leaves), so 20,000 distinct subscriptions from one client once took a
shard master from 35 to 520 MB. The heads socket therefore runs in ZeroMQ's manual mode
(``XPUB_MANUAL``): libzmq applies no subscription itself; the master reads each one with the
descriptor of the connection it came on (``zmq.SRCFD``) and applies it only if it is a
queue's topic (or the empty topic: every queue) and within the caps. A connection asking for
more than ``PER_CONNECTION`` topics at once, or for one that is no queue's topic, is no
client of ours: it is cut (``blizzard.server.departures.cut``), which frees all libzmq kept for it.
A subscription past ``UNKNOWN`` distinct topics of queues that do not exist, or ``TOTAL``
distinct topics in all, is refused (told in the log and the metrics) and its connection
kept, up to ``HELD`` refused at once; past that it is cut too. So a connection costs libzmq
at most ``HELD`` topics of its own beyond those the caps admit for everyone. When a
connection ends (``Departures``), its subscriptions are forgotten.
"""
from __future__ import annotations

import logging

from blizzard.host.log_limit import Throttled
from blizzard.wire.errors import InvalidArgument
from blizzard.wire.queue_settings import check_queue_name

log = logging.getLogger(__name__)

# Topics one connection may ask for at a time, applied or refused (a client asks for the queues
# it consumes from this shard): libzmq keeps each until the connection goes, so this bounds
# what one connection costs (about 13 KB a topic at most: two tries, a node per byte)
PER_CONNECTION = 256
UNKNOWN = 1024  # distinct topics of queues that do not exist, applied at once (all together)
HELD = 16  # subscriptions of one connection refused at once (libzmq keeps them): more, it is cut
TOTAL = 16_384  # distinct topics applied at once (a backstop: queues are few)
# a message bigger than this ends its connection: no topic is (1 byte, a queue name and a NUL),
# but the CURVE handshake's messages are read under the same bound and need a few hundred
MAX_MESSAGE_BYTES = 1024
REFUSALS_LOG_EVERY_S = 10.0

OK, REFUSED, CUT = "ok", "refused", "cut"


def is_topic(topic: bytes) -> bool:
    """A queue's topic (its name and a NUL), or the empty topic (every queue)."""
    if not topic:
        return True
    if not topic.endswith(b"\0"):
        return False
    try:
        check_queue_name(topic[:-1].decode("ascii"))
    except (UnicodeDecodeError, InvalidArgument):
        return False
    return True


class Subscribers:
    """Each connection's topics (by descriptor), how many connections listen to each topic,
    and the counts the metrics show."""

    def __init__(self, per_connection: int = PER_CONNECTION, unknown: int = UNKNOWN,
                 total: int = TOTAL, most_held: int = HELD) -> None:
        self.per_connection, self.unknown, self.total = per_connection, unknown, total
        self.most_held = most_held
        self.applied: dict[int, set[bytes]] = {}  # connection -> topics applied
        self.held: dict[int, set[bytes]] = {}  # connection -> topics refused (libzmq keeps them)
        self.listeners: dict[bytes, int] = {}  # topic -> connections listening
        self.unknown_topics: set[bytes] = set()  # listened to, of no queue when first asked
        self.count = 0  # subscriptions applied, all connections together
        self.refused = 0  # subscriptions refused since start (those of connections cut too)
        self.cut = 0  # connections cut since start
        self.cut_fds: set[int] = set()  # cut, not yet gone: what else they sent is ignored
        self.refusals = Throttled(log, REFUSALS_LOG_EVERY_S)

    def subscribe(self, fd: int, topic: bytes, exists: bool) -> str:
        """What to do with connection ``fd``'s subscription to ``topic`` (``exists``: its
        queue does, or it is the empty topic): apply it (``OK``, counted here), ignore it
        (``REFUSED``) or cut the connection (``CUT``)."""
        applied, held = self.applied.get(fd, set()), self.held.get(fd, set())
        if topic in applied or topic in held or fd in self.cut_fds:
            return REFUSED  # asked for already, or its connection is being cut: nothing to do
        if not is_topic(topic):
            self.refused += 1
            self.refusals("no topic", "cut a heads subscriber asking for %r, no queue's topic",
                          topic[:60])
            return CUT
        if len(applied) + len(held) >= self.per_connection:
            self.refused += 1
            self.refusals("per connection", "cut a heads subscriber asking for more than %d "
                          "topics", self.per_connection)
            return CUT
        new = topic not in self.listeners
        if new and (len(self.listeners) >= self.total
                    or not exists and len(self.unknown_topics) >= self.unknown):
            self.refused += 1
            if len(held) >= self.most_held:
                self.refusals("held", "cut a heads subscriber refused more than %d topics",
                              self.most_held)
                return CUT
            self.held.setdefault(fd, set()).add(topic)
            self.refusals("total", "refused a heads subscription: %d topics are listened to "
                          "(%d of queues that do not exist), the most the master keeps",
                          len(self.listeners), len(self.unknown_topics))
            return REFUSED
        self.applied.setdefault(fd, set()).add(topic)
        self.listeners[topic] = self.listeners.get(topic, 0) + 1
        if new and not exists:
            self.unknown_topics.add(topic)
        self.count += 1
        return OK

    def unsubscribe(self, fd: int, topic: bytes) -> bool:
        """Forget ``fd``'s subscription to ``topic``; True if it was applied (the caller
        takes it off the socket)."""
        held = self.held.get(fd)
        if held is not None and topic in held:
            held.discard(topic)
            if not held:
                del self.held[fd]
        applied = self.applied.get(fd)
        if applied is None or topic not in applied:
            return False
        applied.discard(topic)
        if not applied:
            del self.applied[fd]
        self._unlisten(topic)
        return True

    def gone(self, fd: int) -> None:
        """Connection ``fd`` ended (libzmq dropped what it kept for it)."""
        self.cut_fds.discard(fd)
        self.held.pop(fd, None)
        for topic in self.applied.pop(fd, ()):
            self._unlisten(topic)

    def cutting(self, fd: int) -> None:
        """Connection ``fd`` is being cut."""
        self.cut += 1
        self.gone(fd)
        self.cut_fds.add(fd)

    def listened(self, topic: bytes) -> bool:
        return topic in self.listeners

    def __bool__(self) -> bool:
        return bool(self.listeners)

    def _unlisten(self, topic: bytes) -> None:
        self.count -= 1
        left = self.listeners[topic] - 1
        if left:
            self.listeners[topic] = left
        else:
            del self.listeners[topic]
            self.unknown_topics.discard(topic)
