"""Which connections of a server socket have gone: a socket monitor's disconnect events.

State a server keeps for one connection (a parked long poll, a heads subscription) must go
when the connection does, or a peer that connects, asks and leaves, again and again, fills
the server's tables for good. ZeroMQ names no connection in a message, but each message
carries the descriptor it was read from (``zmq.SRCFD``: ``Frame.get(zmq.SRCFD)``), and the
monitor's ``DISCONNECTED`` event carries the same descriptor when the connection ends.
(libzmq's manual calls ``ZMQ_SRCFD`` deprecated, its replacement ``Peer-Address`` names no
connection; 4.3.5, the one pyzmq bundles, still tells it.)

The event is queued before libzmq closes the descriptor, so before the number can be reused:
a server that reads the events *after* receiving a batch and *before* handling it sees the
departure of every connection that sent the batch's messages from a reused descriptor, and
drops what the old connection left before the new one adds to it. (A message the old
connection sent just before leaving, in the same batch, is then kept until its own time is
up, or the descriptor's next departure.)
"""

from __future__ import annotations

import itertools
import socket

import zmq
from zmq.utils.monitor import parse_monitor_message

_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
SRCFD = int(zmq.SRCFD)  # the frame property: the descriptor a message was read from
_names = itertools.count(1)


def source_fd(frame: zmq.Frame) -> int:
    """The descriptor ``frame`` came in on (-1: none, e.g. one libzmq made itself: it
    refuses to tell with EINVAL)."""
    try:
        return frame.get(SRCFD)
    except zmq.ZMQError:
        return -1


def cut(fd: int, port: int) -> bool:
    """End the connection libzmq holds on descriptor ``fd`` of the socket bound to ``port``:
    its engine reads the end as the peer leaving and frees what it kept for it. The
    descriptor stays libzmq's (shut down, never closed here). False if ``fd`` is no longer
    such a connection (closed meanwhile, or reused by another file or socket)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return False
    try:
        if sock.getsockname()[1] != port:
            return False
        sock.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        sock.detach()


class Departures:
    """Reads the descriptors of ``sock``'s connections that ended (``read``); on a bound
    socket, also whether a descriptor's connection has ended and no new one came on it since
    (``departed``), for state that must never be kept for a connection that is gone."""

    def __init__(self, sock: zmq.Socket) -> None:
        # As ``blizzard.net.secure.HandshakeWatch``: a name never used before, no limit on unread
        # events (libzmq's I/O thread blocks on a full monitor), and ``close`` stops the
        # monitoring before closing the reading end.
        inproc = f"inproc://blizzard.server.departures.{next(_names)}"
        sock.monitor(inproc, zmq.EVENT_DISCONNECTED | zmq.EVENT_ACCEPTED)
        self.sock = sock
        self.events = sock.context.socket(zmq.PAIR)
        self.events.setsockopt(zmq.LINGER, 0)
        self.events.setsockopt(zmq.RCVHWM, 0)
        self.events.connect(inproc)
        self.gone: set[int] = set()  # ended since the last ``read``
        self.ended: set[int] = set()  # ended, and no connection accepted on the number since

    def read(self) -> set[int]:
        """Descriptors of the connections that ended since the last call."""
        self._drain()
        gone, self.gone = self.gone, set()
        return gone

    def departed(self, fd: int) -> bool:
        """Whether a message read from ``fd`` now is a departed connection's (one libzmq
        still had queued when it ended). A connection is accepted before it sends, and its
        acceptance is told before that, so the events read now settle it."""
        if fd not in self.ended:
            return False
        self._drain()
        return fd in self.ended

    def _drain(self) -> None:
        while self.events.get(_EVENTS) & _POLLIN:  # cheaper than a poll, once a pass
            event = parse_monitor_message(self.events.recv_multipart())
            fd = int(event["value"])
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self.gone.add(fd)
                self.ended.add(fd)
            elif event["event"] == zmq.EVENT_ACCEPTED:
                self.ended.discard(fd)

    def close(self) -> None:
        if not self.sock.closed:
            self.sock.monitor(None, 0)
        self.events.close(linger=0)
