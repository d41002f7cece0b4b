"""A sharded client's pipelined writes, and its unawaited acks (``blizzard/shards.py``).

``ShardedProducer`` sends ``window`` batches to one shard, then as many to the next (all to
the key's shard when the producer has a key), through one ``Producer`` per shard, and gives ids
back in send order.
``ShardedStager`` stages the same way; its chunks' ids say where each is committed.
``ShardLeases`` sends ``Message.ack()``'s unawaited acks (the worker's) to each item's shard;
``AcksInFlight`` a consumer's acks beside its next lease; ``pairs`` the (id, lease) items
of the ``*_ids`` calls.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Iterator, Sequence

from blizzard import protocol as p
from blizzard.errors import InvalidArgument, LeaseExpired
from blizzard.pipeline import Staged
from blizzard.shard_pick import UNAVAILABLE
from blizzard.shard_messages import shard_of


class ShardedProducer:
    """``Client.producer`` over shards: ``send`` batches, ``flush`` for their ids in order."""

    def __init__(self, client: Any, queue: str, window: int, options: dict[str, Any]) -> None:
        self.client, self.queue, self.window, self.options = client, queue, window, options
        self.producers: dict[int, Any] = {}
        self.sent: list[tuple[int, int]] = []  # (shard, items) per batch, in send order
        self.turn = client.rng.randrange(len(client.shards))

    def __enter__(self) -> "ShardedProducer":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.flush()

    def send(self, items: Iterable[bytes]) -> None:
        items = list(items)
        key = self.options.get("key")
        if key:
            k = self.client.shard_for(key)
        else:  # a window's worth of batches to one shard, then the next: each master gets
            # batches as dense as a lone master would, so its cost per item does not grow
            k = self.turn // self.window % len(self.client.shards)
            self.turn += 1
        producer = self.producers.get(k)
        if producer is None:
            producer = self.producers[k] = \
                self.client._shard(k).producer(self.queue, window=self.window, **self.options)
        producer.send(items)
        self.sent.append((k, len(items)))

    def flush(self) -> list[int]:
        """Every shard's batches flushed; their ids in send order. A shard that fails does
        not keep the others' batches from being flushed; its error is raised after."""
        sent, self.sent = self.sent, []
        ids: dict[int, Iterator[int]] = {}
        failed: BaseException | None = None
        for k, producer in self.producers.items():
            try:
                ids[k] = iter(producer.flush())
            except Exception as exc:
                failed = failed or exc
        if failed is not None:
            raise failed
        return [next(ids[k]) for k, count in sent for _ in range(count)]


class ShardedStager:
    """``Client.stager`` over shards: each ``send`` is staged on one shard (its key's, or the
    next in turn); ``flush`` gives every chunk, for ``ShardedClient.commit``."""

    def __init__(self, client: Any, queue: str, window: int, chunk_items: int) -> None:
        self.client, self.queue, self.window, self.chunk_items = client, queue, window, chunk_items
        self.stagers: dict[int, Any] = {}
        self.turn = client.rng.randrange(len(client.shards))

    def send(self, items: Iterable[bytes], *, priority: int = 0, delay_s: float = 0.0,
             key: str | None = None) -> None:
        if key:
            k = self.client.shard_for(key)
        else:
            k = self.turn % len(self.client.shards)
            self.turn += 1
        stager = self.stagers.get(k)
        if stager is None:
            stager = self.stagers[k] = self.client._shard(k).stager(
                self.queue, window=self.window, chunk_items=self.chunk_items)
        stager.send(items, priority=priority, delay_s=delay_s, key=key)

    def flush(self) -> Staged:
        return [chunk for stager in self.stagers.values() for chunk in stager.flush()]


class ShardLeases:
    """The part of ``blizzard.leases.Leases`` a worker uses, over shards."""

    def __init__(self, shards: Sequence[Any]) -> None:
        self.shards = shards

    def ack_unawaited(self, msgs: Sequence[Any]) -> None:
        groups: dict[int, list[Any]] = {}
        for m in msgs:
            groups.setdefault(shard_of(m.id), []).append(m)
        for k, group in groups.items():
            self.shards[k].leases.ack_unawaited(group)

    def flush(self, timeout_s: float) -> None:
        for shard in self.shards:
            shard.leases.flush(timeout_s)


class AcksInFlight:
    """The previous batch's acks, sent to their shards at once and collected after the next
    lease: a sharded consumer's lease goes to whichever shard is best, seldom the one its acks
    are for, so instead of riding on the lease they travel beside it (no round trip more).

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


class _Pair:
    """An item as ``*_ids`` calls name it: its id and lease token."""

    __slots__ = ("id", "lease")

    def __init__(self, item_id: int, lease: int) -> None:
        self.id, self.lease = item_id, lease


def pairs(ids: Sequence[int], leases: Sequence[int]) -> list[_Pair]:
    if len(ids) != len(leases):
        raise InvalidArgument(f"{len(ids)} ids but {len(leases)} lease tokens")
    return [_Pair(i, lease) for i, lease in zip(ids, leases)]
