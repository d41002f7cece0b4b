"""A sharded client's pipelined writes, and its unawaited acks (``blizzard/shards.py``).

``ShardedProducer`` sends ``window`` batches to one shard, then as many to the next (all to
the key's shard when the producer has a key), through one ``Producer`` per shard, and gives ids
back in send order.
``ShardedStager`` stages the same way; its chunks' ids say where each is committed.
``ShardLeases`` sends ``Message.ack()``'s unawaited acks (the worker's) to each item's shard;
``AcksInFlight`` a consumer's acks beside its next lease.
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Sequence

from blizzard import protocol as p
from blizzard.errors import LeaseExpired
from blizzard.pipeline import Staged
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
        ids = {k: iter(producer.flush()) for k, producer in self.producers.items()}
        ordered = [next(ids[k]) for k, count in self.sent for _ in range(count)]
        self.sent = []
        return ordered


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
    An ack not answered within ``ACK_WAIT_S`` is sent again the patient way (acks are
    idempotent)."""

    ACK_WAIT_S = 1.0

    def __init__(self, shards: Sequence[Any], groups: dict[int, list[Any]]) -> None:
        self.shards = shards
        self.sent: list[tuple[int, Any, int | None, list[Any]]] = []
        for k, msgs in groups.items():
            ep, rid = shards[k].master.endpoint, None
            if len(msgs) <= p.MAX_BATCH:
                try:
                    rid = ep.send(p.Ack([m.id for m in msgs], [m.lease for m in msgs], False))
                except TimeoutError:
                    rid = None
            self.sent.append((k, ep, rid, msgs))

    def settle(self) -> LeaseExpired | None:
        """Wait for every ack's answer; the first ``LeaseExpired`` among them (not raised)."""
        lost = None
        deadline = time.monotonic() + self.ACK_WAIT_S
        for k, ep, rid, msgs in self.sent:
            reply = None
            while rid is not None and not ep.has(rid) and time.monotonic() < deadline:
                if ep.wait(max(1, int((deadline - time.monotonic()) * 1000))):
                    ep.read_ready()
            if rid is not None:
                reply = ep.take(rid)
            try:
                if isinstance(reply, p.Acked):
                    if reply.lost:
                        raise LeaseExpired(f"items {reply.lost[:10]} are no longer leased under "
                                           "the tokens given: already settled, or the lease ran "
                                           "out; another consumer may hold them now")
                else:
                    self.shards[k].ack_many(msgs)
            except LeaseExpired as exc:
                lost = lost or exc
        return lost
