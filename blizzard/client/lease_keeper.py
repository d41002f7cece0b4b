"""Keeping leases alive while their items are held: the worker's and the dispatcher's one rule.

A worker (``blizzard/worker/loop.py``) holds jobs while they wait, run and wait for their
acks; the dispatcher (``blizzard/dispatch/settle.py``) holds tasks until the master has their
outcomes. A lease left to run out meanwhile lets the master hand the item out again, so both
keep them alive the same way, here:

- A held lease is a ``Held``: its message, its length ``lease_s`` and its ``deadline``
  (monotonic: it ends then unless extended).
- ``LeaseKeeper.due`` says which leases have less than ``EXTEND_AT`` of them left, grouped by
  length: one ``extend_many`` per group.
- The answer to an extension (``extension``) is taken by ``LeaseKeeper.take``: every lease
  extended (new deadlines); some lost (``NOT_HELD``: which ones is not said, so all get the
  new deadline and are in doubt); or no answer (the extension may or may not have happened:
  old deadlines, in doubt, tried again within ``EXTEND_RETRY_S``).

A lease in doubt is settled on its own, never riding on a lease call (one lost ack makes the
master's answer to that lease void). The keeper does no I/O of its own: ``extend`` makes the
call for a caller in the client's thread, and a caller in another thread (the dispatcher's
event loop) runs ``extension`` in the client's and gives its answer to ``take``.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from blizzard.client.message import Message
from blizzard.wire.errors import NOT_HELD, ClusterError

log = logging.getLogger(__name__)

EXTEND_AT = 1 / 3  # extend a lease when this share of it is left
EXTEND_RETRY_S = 1.0  # try an unanswered extension again this soon (sooner for short leases)


@dataclass(slots=True)
class Held:
    """A leased item held, and its lease as this client last knew it."""

    msg: Message
    lease_s: float
    deadline: float  # monotonic: the lease ends then unless extended
    doubtful: bool = False  # its lease may be lost: settle it on its own, never on a lease

    def sure(self, now: float) -> bool:
        """Whether the lease is surely still ours, with time to spare for a lease call."""
        return not self.doubtful and self.deadline - now > self.lease_s * EXTEND_AT / 2


class Extended(enum.Enum):
    """What an extension's answer says of the leases it named."""

    ALL = "every lease extended"
    SOME_LOST = "some leases lost"  # the master extended the others
    UNANSWERED = "no answer"  # extended or not, nobody knows


def retry_s(lease_s: float) -> float:
    """How soon an unanswered extension of ``lease_s`` leases is tried again."""
    return min(EXTEND_RETRY_S, lease_s * EXTEND_AT / 4)


def extension(send: Callable[[list[Message], float], object], group: list[Held],
              lease_s: float) -> Extended:
    """Extend ``group``'s leases to ``lease_s`` from now by ``send(msgs, lease_s)`` (a
    client's ``extend_many``, called in the client's thread); what the answer says. Any
    other error than a lost lease or a cluster that did not answer is raised."""
    try:
        send([h.msg for h in group], lease_s)
    except NOT_HELD as exc:
        log.warning("%s (%d held)", exc.message, len(group))
        return Extended.SOME_LOST
    except ClusterError as exc:
        log.warning("could not extend %d leases, trying again in %.2f s: %s (%s)",
                    len(group), retry_s(lease_s), exc.message, type(exc).__name__)
        return Extended.UNANSWERED
    return Extended.ALL


class LeaseKeeper:
    """When the leases held are due for extension, and what an extension's answer makes of
    them. The held leases are the caller's; it tells the keeper of each new one (``hold``)."""

    def __init__(self) -> None:
        self.next_at = float("inf")  # monotonic: the first lease is due then

    def hold(self, held: Held) -> None:
        """A lease newly held: extended when ``EXTEND_AT`` of it is left."""
        self.next_at = min(self.next_at, held.deadline - held.lease_s * EXTEND_AT)

    def due(self, held: Iterable[Held], now: float) -> dict[float, list[Held]]:
        """The leases of ``held`` with less than ``EXTEND_AT`` left, by length (none before
        ``next_at``); ``next_at`` becomes the time the first of the others is due."""
        if now < self.next_at:
            return {}
        due: dict[float, list[Held]] = {}
        self.next_at = float("inf")
        for h in held:
            if h.deadline - now < h.lease_s * EXTEND_AT:
                due.setdefault(h.lease_s, []).append(h)
            else:
                self.next_at = min(self.next_at, h.deadline - h.lease_s * EXTEND_AT)
        return due

    def take(self, group: list[Held], lease_s: float, now: float, answer: Extended) -> None:
        """Take the answer to an extension of ``group`` to ``lease_s`` sent at ``now``."""
        if answer is Extended.UNANSWERED:
            for h in group:
                h.doubtful = True
            self.next_at = min(self.next_at, now + retry_s(lease_s))
            return
        doubtful = answer is Extended.SOME_LOST
        for h in group:
            h.doubtful, h.deadline = doubtful, now + lease_s
        self.next_at = min(self.next_at, now + lease_s * (1 - EXTEND_AT))

    def extend_due(self, held: Iterable[Held],
                   send: Callable[[list[Message], float], object]) -> None:
        """Extend every lease of ``held`` that is due, by ``send(msgs, lease_s)`` (a client's
        ``extend_many``), in the caller's thread."""
        now = time.monotonic()
        for lease_s, group in self.due(held, now).items():
            self.take(group, lease_s, now, extension(send, group, lease_s))
