"""Leases from the client's side: take items from a queue, then settle them.

Settling (ack, nack, extend) names each item by id and lease token, so a consumer whose
lease ran out cannot settle an item another consumer holds now: the master reports it as
lost and the call raises ``LeaseExpired``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from blizzard.client.master_link import MasterLink
from blizzard.client.message import LeasedItem, leased_items
from blizzard.net.transport import call
from blizzard.wire import protocol as p
from blizzard.wire.codec import as_ids
from blizzard.wire.errors import (
    BlizzardError,
    InvalidArgument,
    LeaseExpired,
    NotInQueue,
    UnknownItem,
    WrongLease,
)
from blizzard.wire.queue_settings import check_queue_name


class Leases:
    """Lease, ack, nack and extend through the master link."""

    def __init__(self, master: MasterLink,
                 heard: Callable[[list[str]], None] = lambda suspects: None,
                 pool: Any = None) -> None:
        self.master = master
        self.heard = heard  # told the master's suspect data nodes from each lease reply
        # the data-node pool (``DatanodePool``) whose connections a data node may answer a
        # lease on, payloads and all (``master/consume/pushes.py``); None: the master answers
        self.pool = pool
        self.quiet_sent = False  # quiet acks sent since the last flush

    def lease(self, queue: str, n: int, *, lease_s: float | None = None, wait_s: float = 0.0,
              ack: Sequence[Any] = ()) -> list[LeasedItem]:
        """Up to ``n`` head items of ``queue``, leased; ``ack`` settles a previous batch first.
        A data node may answer with the payloads too: the next ``DatanodePool.read`` takes them."""
        return leased_items(self.lease_columns(queue, n, lease_s=lease_s, wait_s=wait_s, ack=ack,
                                               push=self.pool is not None))

    def lease_columns(self, queue: str, n: int, *, lease_s: float | None = None,
                      wait_s: float = 0.0, ack: Sequence[Any] = (), head: bool = False,
                      timeout_s: float | None = None, ids: Sequence[int] = (),
                      push: bool = False) -> p.Leased:
        """``lease`` as the master's reply: one list per field, no object per item (what a
        Spark driver leasing a million items wants). ``head``: the reply also tells the
        queue's head after the lease (a sharded client's news of this shard). ``timeout_s``:
        give up sooner than the client's own (a sharded client turns to another shard).
        ``ids``: lease these items (those ready or delayed in ``queue``), not the head.
        ``push``: a data node may answer, payloads and all (kept for the pool's next read)."""
        check_queue_name(queue)
        if type(n) is not int:
            raise InvalidArgument("n must be an integer")
        if lease_s is None:
            lease_s = 0.0  # the master applies the queue's default
        elif not isinstance(lease_s, bool) and isinstance(lease_s, (int, float)) and lease_s <= 0:
            raise InvalidArgument(f"lease_s must be positive, got {lease_s!r}")
        if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)) \
                or isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)):
            raise InvalidArgument("lease_s and wait_s must be numbers of seconds")
        pool = self.pool if push else None
        reply = self.master.call(
            p.Lease(queue, n, float(lease_s), float(wait_s), self.master.call_id(),
                    [m.id for m in ack], [m.lease for m in ack], head, as_ids(list(ids)),
                    pool.routing_id if pool is not None else b"",
                    pool.push_key if pool is not None else b""),
            extra_s=float(wait_s) if wait_s > 0 else 0.0,
            since=None if timeout_s is None
            else time.monotonic() - self.master.timeout_s + timeout_s,
            also=pool.connected() if pool is not None else (),
            genuine=pool.genuine if pool is not None else None)
        leased: p.Leased = pool.take_pushed(reply) if pool is not None else reply
        self.heard(leased.suspects)
        if leased.lost:
            if leased.ids:
                self.master.call(p.Nack(leased.ids, leased.leases, 0.0, ""))
            raise LeaseExpired(f"items {leased.lost[:10]} were no longer leased under the tokens "
                               "acked: already settled (acked or nacked), or the lease ran out; "
                               "another consumer may hold them now")
        return leased

    def extend_many(self, msgs: Sequence[Any], *, lease_s: float,
                    progress: Mapping[int, tuple[float, str, bytes]] | None = None) -> list[int]:
        return self.extend_ids(*_columns(msgs), lease_s=lease_s, queue=queue_of(msgs),
                               progress=progress)

    def extend_ids(self, ids: Sequence[int], leases: Sequence[int], *, lease_s: float,
                   queue: str = "",
                   progress: Mapping[int, tuple[float, str, bytes]] | None = None) -> list[int]:
        """Extend; the ids of jobs cancelled meanwhile (their workers should stop them).
        ``progress``: by id, (fraction done, note, state) to record on the master."""
        def make(ids: list[p.Id], leases: list[int]) -> p.Extend:
            told = [i for i in ids if i in progress] if progress else []
            if not told or progress is None:
                return p.Extend(ids, leases, float(lease_s), queue)
            columns = zip(*(progress[i] for i in told), strict=True)
            fractions, notes, states = (list(col) for col in columns)
            return p.Extend(ids, leases, float(lease_s), queue, told, fractions, notes, states)
        return self._settle(ids, leases, make)

    def ack_many(self, msgs: Sequence[Any]) -> None:
        self.ack_ids(*_columns(msgs), queue=queue_of(msgs))

    def ack_ids(self, ids: Sequence[int], leases: Sequence[int], queue: str = "",
                late: bool = False) -> None:
        """Ack by ids and lease tokens; ``queue`` (if not ""): every id must be in it.
        ``late``: an item whose lease under the token ran out is acked too, if no one leased
        it since (the master remembers that token until then, not across its restart)."""
        self._settle(ids, leases, lambda ids, leases: p.Ack(ids, leases, False, queue, late))

    def ack_unawaited(self, msgs: Sequence[Any]) -> None:
        """Send acks the master applies without replying (``Message.ack()``): nothing to wait for.

        A lost lease is only logged by the master; the item was (or will be) delivered again.
        """
        if len(msgs) > p.MAX_BATCH:
            self.ack_many(msgs)
            return
        try:
            self.master.endpoint.send(p.Ack(as_ids([m.id for m in msgs]), [m.lease for m in msgs],
                                            True, queue_of(msgs)))
            self.quiet_sent = True
        except TimeoutError:  # the send queue is full: the slow way, with retries
            self.ack_many(msgs)

    def flush(self, timeout_s: float) -> None:
        """Wait (up to ``timeout_s``) until the quiet acks sent so far are durable on the master.

        The master handles a connection's requests in order and answers only after its fsync,
        so the answer to a ``Ping`` sent after them says they are applied and on disk.
        """
        if self.quiet_sent:
            call(self.master.endpoint, p.Ping(), timeout_s)
            self.quiet_sent = False

    def nack_many(self, msgs: Sequence[Any], *, delay_s: float | None = None,
                  error: str = "") -> None:
        self.nack_ids(*_columns(msgs), delay_s=delay_s, error=error, queue=queue_of(msgs))

    def regrant(self, ids: Sequence[int], leases: Sequence[int]) -> tuple[p.GetGrant, list[p.Id]]:
        """A fresh grant to read items still leased under these tokens (at most MAX_BATCH),
        and the ids that are not (the grant leaves them out)."""
        reply: p.Regranted = self.master.call(p.Regrant(as_ids(list(ids)), list(leases)))
        return reply.grant, reply.lost

    def nack_ids(self, ids: Sequence[int], leases: Sequence[int], *, delay_s: float | None = None,
                 error: str = "", queue: str = "", priority: int | None = None) -> None:
        """Give leased items back (``priority``: at that priority from now on)."""
        delay = None if delay_s is None else float(delay_s)
        self._settle(ids, leases, lambda ids, leases: p.Nack(ids, leases, delay, str(error),
                                                             queue, priority))

    def _settle(self, ids: Sequence[int], leases: Sequence[int],
                make: Callable[[list[p.Id], list[int]], Any]) -> list[int]:
        """Send ``make(ids, leases)`` in batches; raise ``refusal``'s error for any refused;
        the ids the replies say are cancelled (to an extension)."""
        if len(ids) != len(leases):
            raise InvalidArgument(f"{len(ids)} ids but {len(leases)} lease tokens")
        lost: list[int] = []
        why: list[int] = []
        cancel: list[int] = []
        queue = ""
        for start in range(0, len(ids), p.MAX_BATCH):
            end = start + p.MAX_BATCH
            request = make(as_ids(list(ids[start:end])), list(leases[start:end]))
            reply: p.Acked = self.master.call(request)
            lost += reply.lost
            why += reply.why
            cancel += reply.cancel
            queue = request.queue
        error = refusal(lost, why, queue)
        if error is not None:
            raise error
        return cancel


def refusal(lost: Sequence[int], why: Sequence[int], queue: str = "") -> BlizzardError | None:
    """The error for ids an ack, nack or extend could not settle (``Acked.lost``, ``.why``):
    by the first id's reason, naming the ids of each reason (and ``queue``, the one the
    request named); None if every id was settled."""
    if not lost:
        return None
    why = list(why) + [p.LOST_EXPIRED] * (len(lost) - len(why))  # an older master gives none
    by_reason: dict[int, list[int]] = {}
    for item_id, reason in zip(lost, why, strict=True):
        by_reason.setdefault(reason, []).append(item_id)
    text = "; ".join(REFUSALS[reason][1].format(queue=queue or "the one named") + f": {ids[:10]}"
                     + (" ..." if len(ids) > 10 else "") for reason, ids in by_reason.items())
    return REFUSALS[why[0]][0](text)


REFUSALS: dict[int, tuple[type[BlizzardError], str]] = {  # reason -> (error, what it means)
    p.LOST_EXPIRED: (LeaseExpired, "not leased under this token any more (its lease ran out, "
                     "or it was nacked or acked under it, or under another consumer's "
                     "lease): items"),
    p.LOST_UNKNOWN: (UnknownItem, "no such item (never made, or finished long ago): ids"),
    p.LOST_OTHER_QUEUE: (NotInQueue, "not in queue {queue} (`blizzard queue list` shows the "
                         "queues): items"),
    p.LOST_WRONG_TOKEN: (WrongLease, "leased under another token than the one given (a wrong "
                         "token, or this lease ended - ran out, or the item was nacked - and "
                         "the item was delivered again): items"),
}


def queue_of(msgs: Sequence[Any]) -> str:
    """The queue all these messages came from ("" if they name none, or several): an ack
    naming it is refused for an item that is not in it."""
    queues = {getattr(m, "queue", "") for m in msgs}
    return queues.pop() if len(queues) == 1 else ""


def _columns(msgs: Sequence[Any]) -> tuple[list[int], list[int]]:
    """The ids and lease tokens of messages or leased items."""
    return [m.id for m in msgs], [m.lease for m in msgs]
