"""A sharded consumer's acks: held until a lease to their own shard can carry them, or sent
to their shards beside a lease and collected after it.

A consumer's lease goes to whichever shard has the best head, not always the one its last
batch came from. An ack of its own would cost that shard's master a request and a loop pass
besides the lease's, so acks wait, ``HOLD_S`` at most, for a lease to their shard to ride on
(``HeldAcks``); those held longer, or a batch's worth, travel beside the next lease
(``AcksInFlight``). Delivery stays at least once: an ack still held when a consumer dies lets
its item come back when the lease runs out. ``close``, ``ack_many`` and ``stats`` send every
held ack first.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable, Sequence

from blizzard import protocol as p
from blizzard.errors import BlizzardError, LeaseExpired
from blizzard.shard_pick import UNAVAILABLE

log = logging.getLogger(__name__)

HOLD_S = 0.2  # the longest an ack waits for a lease to its shard (a quarter of a shorter lease)


class HeldAcks:
    """Acks by shard, each group with the time its oldest came."""

    def __init__(self) -> None:
        self.groups: dict[int, tuple[float, list[Any]]] = {}

    def __bool__(self) -> bool:
        return bool(self.groups)

    def add(self, groups: dict[int, list[Any]], now: float) -> None:
        for k, msgs in groups.items():
            since, held = self.groups.get(k, (now, []))
            self.groups[k] = (since, held + msgs)

    def due(self, now: float, lease_s: float | None) -> dict[int, list[Any]]:
        """Take out the groups that must go now: held long enough, or a batch's worth."""
        hold_s = HOLD_S if lease_s is None else min(HOLD_S, lease_s / 4)
        due = [k for k, (since, msgs) in self.groups.items()
               if now - since >= hold_s or len(msgs) >= p.MAX_BATCH // 2]
        return {k: self.groups.pop(k)[1] for k in due}

    def riding(self) -> dict[int, list[Any]]:
        """What a lease to each shard carries."""
        return {k: msgs for k, (_, msgs) in self.groups.items()}

    def most(self) -> int | None:
        """The shard holding the most acks: the one to stay on when heads tie."""
        return max(self.groups, key=lambda k: len(self.groups[k][1])) if self.groups else None

    def settled(self, shards: set[int]) -> None:
        """These shards' acks rode on a lease and are settled."""
        for k in shards:
            self.groups.pop(k, None)

    def take_all(self) -> dict[int, list[Any]]:
        groups, self.groups = self.groups, {}
        return {k: msgs for k, (_, msgs) in groups.items()}


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
        self.retried = False  # acks owed before are among them
        self.sent: list[tuple[int, Any, int | None, list[Any]]] = []
        for k, msgs in groups.items():
            self.add(k, msgs)

    def add(self, k: int, msgs: list[Any]) -> None:
        """Send acks for shard ``k`` too."""
        ep, rid = self.shards[k].master.endpoint, None
        if len(msgs) <= p.MAX_BATCH and not self.down(k):
            try:
                rid = ep.send(p.Ack([m.id for m in msgs], [m.lease for m in msgs], False))
            except TimeoutError:
                rid = None
        self.sent.append((k, ep, rid, msgs))

    def settle(self) -> tuple[LeaseExpired | None, list[Any]]:
        """Wait for every ack's answer: the first ``LeaseExpired`` among them (not raised),
        and the acks owed."""
        lost, owed = None, []
        deadline = time.monotonic() + self.ACK_WAIT_S
        for k, ep, rid, msgs in self.sent:
            while rid is not None and not ep.has(rid) and time.monotonic() < deadline:
                if ep.wait(max(1, int((deadline - time.monotonic()) * 1000))):
                    ep.read_ready()
            reply = ep.take(rid) if rid is not None else None
            if isinstance(reply, p.Acked):
                if reply.lost:
                    lost = lost or LeaseExpired(
                        f"items {reply.lost[:10]} are no longer leased under the tokens given: "
                        "already settled, or the lease ran out; another consumer may hold "
                        "them now")
                continue
            if (rid is not None and reply is None) or self.down(k):
                owed += msgs  # silent, or known down: not waited on now
                continue
            try:
                self.shards[k].ack_many(msgs)
            except LeaseExpired as exc:
                lost = lost or exc
            except UNAVAILABLE:
                owed += msgs
        return lost, owed


class ConsumerAcks:
    """A sharded client's acks: those held (``held``), and those owed (``owed``: their shard
    did not answer; sent again with each lease until taken)."""

    def __init__(self, shards: Sequence[Any], by_shard: Callable[[Iterable[Any]], dict],
                 down: Callable[[int], bool]) -> None:
        self.shards, self.by_shard, self.down = shards, by_shard, down
        self.held = HeldAcks()
        self.owed: list[Any] = []

    def start(self, ack: Sequence[Any], lease_s: float | None) -> AcksInFlight:
        """Before a lease: hold ``ack``; send those owed and those due beside the lease."""
        now = time.monotonic()
        self.held.add(self.by_shard(ack), now)
        acks = AcksInFlight(self.shards, self.by_shard(self.owed), self.down)
        acks.retried = bool(self.owed)
        for k, msgs in self.held.due(now, lease_s).items():
            acks.add(k, msgs)
        return acks

    def finish(self, acks: AcksInFlight, rode: set[int]) -> LeaseExpired | None:
        """After the lease: drop the held acks that rode on it, collect those sent beside it;
        the first lost lease among them (not raised)."""
        self.held.settled(rode)
        lost, self.owed = acks.settle()
        if self.owed and not acks.retried:  # said once, not at every lease while a shard is down
            log.warning("%d acks owed to shards that did not answer; sent again with each "
                        "lease until taken", len(self.owed))
        return lost

    def send_held(self, quiet: bool = False) -> None:
        """Send every held ack to its shard now; ``LeaseExpired`` if one was lost (logged
        instead with ``quiet``: a call that settles nothing should not fail for it)."""
        if not self.held:
            return
        lost, owed = AcksInFlight(self.shards, self.held.take_all(), self.down).settle()
        self.owed += owed
        if lost is not None and quiet:
            log.warning("acks held for a lease to their shard came too late: %s", lost)
        elif lost is not None:
            raise lost

    def close(self) -> None:
        """Send what is held or owed, one more try; what stays owed comes back when its
        leases run out."""
        self.send_held(quiet=True)
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
