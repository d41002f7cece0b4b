"""What a dequeue hands out: ``LeasedItem`` (where an item is) and ``Message`` (its payload).

A ``Message`` settles itself through ``Settle``, the three lease calls, not through the
whole client.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from blizzard.wire import protocol as p


@dataclass(slots=True)
class LeasedItem:
    """A leased item as the master described it: where its replicas are, what to check.

    Picklable, so a driver can lease and hand items to workers that ``fetch`` them. ``grant``
    is the capability to read it (and the other items of its lease) from its replicas.
    """

    id: int
    lease: int
    size: int
    crc: int
    attempts: int
    priority: int
    enqueued_at: float
    nodes: list[p.NodeRef]
    key: str = ""  # "": none
    grant: p.GetGrant | None = None  # None: read without one (a data node without security)
    error: str = ""  # the last nack's error text ("": none), e.g. why a dead item died
    lease_s: float = 0.0  # the item's own lease length, given at its enqueue (0: none)
    state: bytes = b""  # the progress state an earlier attempt saved (b"": none)
    tick: float = 0.0  # a schedule's item: the tick it runs for (unix time; 0: none)


def leased_items(leased: p.Leased) -> list[LeasedItem]:
    """The items of a ``Leased`` reply (to a lease or a peek), one object each."""
    own = leased.ttrs or [0.0] * len(leased.ids)
    saved = leased.states or [b""] * len(leased.ids)
    ticks = leased.ticks or [0.0] * len(leased.ids)
    return [LeasedItem(leased.ids[i], leased.leases[i], leased.sizes[i], leased.crcs[i],
                       leased.attempts[i], leased.priorities[i], leased.enqueued_at[i],
                       leased.replica_sets[leased.replica_set[i]].nodes, leased.keys[i],
                       leased.grant, leased.errors[i], own[i], saved[i], ticks[i])
            for i in range(len(leased.ids))]


class Settle(Protocol):
    """The lease calls a message settles itself with (``blizzard.client.leases.Leases``)."""

    def ack_many(self, msgs: Sequence[Any]) -> None: ...

    def ack_unawaited(self, msgs: Sequence[Any]) -> None: ...

    def nack_many(self, msgs: Sequence[Any], *, delay_s: float | None = None,
                  error: str = "") -> None: ...

    def extend_many(self, msgs: Sequence[Any], *, lease_s: float) -> Any: ...


@dataclass(slots=True)
class Message:
    """A leased item. ``ack()`` when done; ``nack()`` to give it back; or use it as a context
    manager."""

    id: int
    data: bytes
    queue: str
    attempts: int
    priority: int
    enqueued_at: float
    lease: int
    _leases: Settle
    key: str = ""  # "": none
    error: str = ""  # the last nack's error text ("": none), e.g. why a dead item died
    lease_s: float = 0.0  # the item's own lease length, given at its enqueue (0: none)
    state: bytes = b""  # the progress state an earlier attempt saved (b"": none)
    tick: float = 0.0  # a schedule's item: the tick it runs for (unix time; 0: none)

    def ack(self, wait: bool = False) -> None:
        """The item is done: the master drops it and its blobs.

        By default the ack is sent and not waited for, and the master sends no answer (as
        RabbitMQ's ``basic.ack``); ``Client.close`` waits up to 2 s until they are durable. An
        ack the master refuses (the lease had run out, say) is then only counted in its
        metrics (``blizzard_acks_refused_total``) and logged. ``wait=True`` returns once the
        ack is durable on the master, or raises why it was refused: ``LeaseExpired`` (the
        lease ran out), ``WrongLease`` (the item is leased under another token now),
        ``NotInQueue`` or ``UnknownItem``; the item is then unchanged.
        Either way delivery stays at least once: an ack that never lands lets the item come
        back when its lease runs out.
        """
        if wait:
            self._leases.ack_many([self])
        else:
            self._leases.ack_unawaited([self])

    def nack(self, delay_s: float | None = None, error: str = "") -> None:
        """Give the item back: after ``delay_s``, or (None) after the queue's retry back-off.

        ``error`` is kept with the item and shown if it ends up dead-lettered.
        """
        self._leases.nack_many([self], delay_s=delay_s, error=error)

    def extend(self, lease_s: float) -> None:
        """Keep the lease for ``lease_s`` more seconds from now (a long job's touch)."""
        self._leases.extend_many([self], lease_s=lease_s)

    def __enter__(self) -> Message:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.ack()
        else:
            self.nack(error=f"{exc_type.__name__}: {exc}")
