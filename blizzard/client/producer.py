"""Pipelining producers: several enqueue (or stage) batches in flight on one client.

``send`` hands a batch to the enqueue pipeline (the one ``Client.enqueue_many`` uses) and
returns as soon as it is under way, so the round trips and fsyncs of up to ``window`` chunks
overlap. A batch is acknowledged (its ids returned by ``flush``) only after its commit is
durable; a step that fails is retried as ``enqueue_many`` retries it. ``Stager`` does the same
for ``Client.stage``: batches stored durably but invisible, for one ``commit`` later.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from blizzard.client.enqueue_options import EnqueueOptions
from blizzard.client.pipeline import CHUNK_ITEMS, EnqueuePipeline, Staged, Window, staged_chunk
from blizzard.wire.errors import InvalidArgument
from blizzard.wire.protocol import MAX_BATCH


class Producer:
    """``with client.producer("jobs") as prod: prod.send(batch) ...; ids = prod.flush()``."""

    def __init__(self, pipeline: EnqueuePipeline, queue: str, *, window: int = 4,
                 priority: int = 0, delay_s: float = 0.0, key: str | None = None,
                 coalesce: bool = False) -> None:
        self.pipeline = pipeline
        self.queue = queue
        self.opts = EnqueueOptions.make(priority, delay_s, None, key, coalesce)
        self.window = Window(pipeline, window)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.flush()

    def send(self, items: Iterable[bytes]) -> None:
        """Start enqueueing one batch; waits only while ``window`` chunks are already in flight.

        A batch larger than a chunk (1,000 items or 16 MiB) goes as several chunks.
        """
        for chunk in self.pipeline.chunks(self.queue, items, self.opts):
            self.window.add(chunk)

    def flush(self) -> list[int]:
        """Wait for every batch sent so far; return their ids in send order."""
        return [i for chunk in self.window.wait() for i in chunk.ids]


class Stager:
    """``st = client.stager("jobs"); st.send(batch) ...; client.commit(st.flush())``.

    Each ``send`` may carry its own priority, delay and key; up to ``window`` chunks of up
    to ``chunk_items`` items are being stored at once (bigger chunks: fewer messages, the
    larger part of the servers' cost per item).
    """

    def __init__(self, pipeline: EnqueuePipeline, queue: str, *, window: int = 8,
                 chunk_items: int = CHUNK_ITEMS) -> None:
        if not 1 <= chunk_items <= MAX_BATCH:
            raise InvalidArgument(f"chunk_items must be 1..{MAX_BATCH}, got {chunk_items}")
        self.pipeline = pipeline
        self.queue = queue
        self.window = Window(pipeline, window)
        self.chunk_items = chunk_items

    def send(self, items: Iterable[bytes], *, priority: int = 0, delay_s: float = 0.0,
             key: str | None = None) -> None:
        """Start staging one batch; waits only while ``window`` chunks are already in flight."""
        opts = EnqueueOptions.make(priority, delay_s, None, key)
        for chunk in self.pipeline.chunks(self.queue, items, opts, commit=False,
                                          chunk_items=self.chunk_items):
            self.window.add(chunk)

    def flush(self) -> Staged:
        """Wait for every batch sent so far; (ids, node ids, grants) per chunk, in send order."""
        return [staged_chunk(chunk) for chunk in self.window.wait()]
