"""A sharded consumer's acks (``dequeue_many(ack=...)``): on its next lease when that goes to
their shard, else sent to their shards beside it and collected after it, in the same call.

A consumer's lease goes to whichever shard has the best head; among heads of equal priority
enqueued close together the picker stays on the shard of the acks, so they usually ride.
Holding acks back for a later lease to their shard was tried and taken out: nothing sends them
if the next call comes late (a slow job, a full worker), so a lease could run out on an item
already done.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from blizzard.client.leases import queue_of, refusal
from blizzard.client.sharded.pick import UNAVAILABLE
from blizzard.wire import protocol as p
from blizzard.wire.errors import BlizzardError, LeaseExpired, NotInQueue, UnknownItem

log = logging.getLogger(__name__)


class AcksInFlight:
    """Acks sent to their shards at once and collected after the next lease (no round trip
    more).

    An ack its shard does not answer within ``ACK_WAIT_S``, or that is for a shard passed over
    as down (``down``), is owed: ``settle`` gives it back to be sent again with the next call
    (acks are idempotent), so a dead shard neither holds up nor fails a lease from another.
    One answered with an error is sent again the patient way."""

    ACK_WAIT_S = 1.0

    def __init__(self, shards: Sequence[Any], groups: dict[int, list[Any]],
                 down: Callable[[int], bool]) -> None:
        self.shards, self.down = shards, down
        self.sent: list[tuple[int, Any, int | None, list[Any]]] = []
        for k, msgs in groups.items():
            self.add(k, msgs)

    def add(self, k: int, msgs: list[Any]) -> None:
        """Send acks for shard ``k`` too."""
        ep, rid = self.shards[k].master.endpoint, None
        if len(msgs) <= p.MAX_BATCH and not self.down(k):
            try:
                rid = ep.send(p.Ack([m.id for m in msgs], [m.lease for m in msgs], False,
                                    queue_of(msgs)))
            except TimeoutError:
                rid = None
        self.sent.append((k, ep, rid, msgs))

    def settle(self) -> tuple[BlizzardError | None, list[Any]]:
        """Wait for every ack's answer: the first refusal among them (not raised, see ``refusal``),
        and the acks owed."""
        lost, owed = None, []
        deadline = time.monotonic() + self.ACK_WAIT_S
        for k, ep, rid, msgs in self.sent:
            while rid is not None and not ep.has(rid) and time.monotonic() < deadline:
                if ep.wait(max(1, int((deadline - time.monotonic()) * 1000))):
                    ep.read_ready()
            reply = ep.take(rid) if rid is not None else None
            if isinstance(reply, p.Acked):
                lost = lost or refusal(reply.lost, reply.why)
                continue
            if (rid is not None and reply is None) or self.down(k):
                owed += msgs  # silent, or known down: not waited on now
                continue
            try:
                self.shards[k].ack_many(msgs)
            except (LeaseExpired, NotInQueue, UnknownItem) as exc:  # refused: see ``refusal``
                lost = lost or exc
            except UNAVAILABLE:
                owed += msgs
        return lost, owed


class ConsumerAcks:
    """A sharded client's acks in flight, and those owed (``owed``: their shard did not
    answer; sent again with each lease until taken)."""

    def __init__(self, shards: Sequence[Any],
                 by_shard: Callable[[Iterable[Any]], dict[int, list[Any]]],
                 down: Callable[[int], bool]) -> None:
        self.shards, self.by_shard, self.down = shards, by_shard, down
        self.owed: list[Any] = []
        self._retrying = False  # the call under way sends acks owed before (said already)

    def start(self, ack: Sequence[Any]) -> tuple[AcksInFlight, int | None, list[Any]]:
        """Before a lease: the acks sent beside it, and (shard, acks) to ride on it if they
        are all of one shard."""
        self._retrying = bool(self.owed)
        groups = self.by_shard([*self.owed, *ack])
        prefer = next(iter(groups)) if len(groups) == 1 else None
        riding = groups.pop(prefer) if prefer is not None else []
        return AcksInFlight(self.shards, groups, self.down), prefer, riding

    def finish(self, beside: AcksInFlight, prefer: int | None, riding: list[Any],
               rode: bool) -> BlizzardError | None:
        """After the lease (or its failure): riding acks that did not ride follow it; collect
        every ack sent beside; the first lost lease among them (not raised)."""
        if riding and not rode:  # the lease went elsewhere: they follow it
            assert prefer is not None  # riding acks are all of shard ``prefer``
            beside.add(prefer, riding)
        lost, self.owed = beside.settle()
        if self.owed and not self._retrying:  # said once, not at every lease while one is down
            log.warning("%d acks owed to shards that did not answer; sent again with each "
                        "lease until taken", len(self.owed))
        return lost

    def close(self) -> None:
        """One more try for the acks owed; what stays owed comes back when its leases run out."""
        if not self.owed:
            return
        try:
            _, owed = AcksInFlight(self.shards, self.by_shard(self.owed), lambda k: False).settle()
        except BlizzardError:
            owed = self.owed
        if owed:
            log.warning("closing with %d acks their shards did not take: those items are "
                        "delivered again when their leases run out", len(owed))
        self.owed = []
