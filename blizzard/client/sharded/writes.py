"""A sharded client's pipelined writes, and its unawaited acks
(``blizzard/client/sharded/client.py``).

``ShardedProducer`` sends ``window`` batches to one shard, then as many to the next (all to
the key's shard when the producer has a key), through one ``Producer`` per shard, and gives ids
back in send order.
``ShardedStager`` stages the same way; its chunks' ids say where each is committed.
``ShardLeases`` sends ``Message.ack()``'s unawaited acks (the worker's) to each item's shard;
``pairs`` makes the (id, lease) items of the ``*_ids`` calls. A consumer's acks:
``blizzard/client/sharded/acks.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from blizzard.client.pipeline import Staged
from blizzard.wire.errors import InvalidArgument
from blizzard.wire.shard_messages import shard_of


class ShardedProducer:
    """``Client.producer`` over shards: ``send`` batches, ``flush`` for their ids in order."""

    def __init__(self, client: Any, queue: str, window: int, options: dict[str, Any]) -> None:
        self.client, self.queue, self.window, self.options = client, queue, window, options
        self.producers: dict[int, Any] = {}
        self.sent: list[tuple[int, int]] = []  # (shard, items) per batch, in send order
        self.turn = client.rng.randrange(len(client.shards))

    def __enter__(self) -> ShardedProducer:
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
    """The part of ``blizzard.client.leases.Leases`` a worker uses, over shards."""

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


class _Pair:
    """An item as ``*_ids`` calls name it: its id and lease token (and the queue an ack
    names, "" for none)."""

    __slots__ = ("id", "lease", "queue")

    def __init__(self, item_id: int, lease: int, queue: str = "") -> None:
        self.id, self.lease, self.queue = item_id, lease, queue


def pairs(ids: Sequence[int], leases: Sequence[int], queue: str = "") -> list[_Pair]:
    if len(ids) != len(leases):
        raise InvalidArgument(f"{len(ids)} ids but {len(leases)} lease tokens")
    return [_Pair(i, lease, queue) for i, lease in zip(ids, leases, strict=True)]
