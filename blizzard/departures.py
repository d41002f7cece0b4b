"""Which connections of a server socket have gone: a socket monitor's disconnect events.

State a server keeps for one connection (a parked long poll, a heads subscription) must go
when the connection does, or a peer that connects, asks and leaves, again and again, fills
the server's tables for good. ZeroMQ names no connection in a message, but each message
carries the descriptor it was read from (``zmq.SRCFD``: ``Frame.get(zmq.SRCFD)``), and the
monitor's ``DISCONNECTED`` event carries the same descriptor when the connection ends.

The event is queued before libzmq closes the descriptor, so before the number can be reused:
a server that reads the events *after* receiving a batch and *before* handling it sees the
departure of every connection that sent the batch's messages from a reused descriptor, and
drops what the old connection left before the new one adds to it. (A message the old
connection sent just before leaving, in the same batch, is then kept until its own time is
up, or the descriptor's next departure.)
"""

from __future__ import annotations

import itertools
import logging

import zmq
from zmq.utils.monitor import parse_monitor_message

log = logging.getLogger(__name__)

_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
SRCFD = int(zmq.SRCFD)  # the frame property: the descriptor a message was read from
_names = itertools.count(1)


def source_fd(frame: zmq.Frame) -> int:
    """The descriptor ``frame`` came in on (-1: none, e.g. one libzmq made itself)."""
    return frame.get(SRCFD)


class Departures:
    """Reads the descriptors of ``sock``'s connections that ended (``read``)."""

    def __init__(self, sock: zmq.Socket) -> None:
        # As ``blizzard.secure.HandshakeWatch``: a name never used before, no limit on unread
        # events (libzmq's I/O thread blocks on a full monitor), and ``close`` stops the
        # monitoring before closing the reading end.
        inproc = f"inproc://blizzard.departures.{next(_names)}"
        sock.monitor(inproc, zmq.EVENT_DISCONNECTED)
        self.sock = sock
        self.events = sock.context.socket(zmq.PAIR)
        self.events.setsockopt(zmq.LINGER, 0)
        self.events.setsockopt(zmq.RCVHWM, 0)
        self.events.connect(inproc)

    def read(self) -> set[int]:
        """Descriptors of the connections that ended since the last call."""
        gone: set[int] = set()
        while self.events.get(_EVENTS) & _POLLIN:  # cheaper than a poll, once a pass
            event = parse_monitor_message(self.events.recv_multipart())
            if event["event"] == zmq.EVENT_DISCONNECTED:
                gone.add(int(event["value"]))
        return gone

    def close(self) -> None:
        if not self.sock.closed:
            self.sock.monitor(None, 0)
        self.events.close(linger=0)
