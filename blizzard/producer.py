"""A pipelining producer: several enqueue batches in flight on one client.

``send`` hands a batch to the enqueue pipeline (the one ``Client.enqueue_many`` uses) and
returns as soon as it is under way, so the round trips and fsyncs of up to ``window`` chunks
overlap. A batch is acknowledged (its ids returned by ``flush``) only after its commit is
durable; a step that fails is retried as ``enqueue_many`` retries it.
"""

from __future__ import annotations

from typing import Any, Iterable

from blizzard.enqueue_options import EnqueueOptions
from blizzard.pipeline import EnqueuePipeline, Window


class Producer:
    """``with client.producer("jobs") as prod: prod.send(batch) ...; ids = prod.flush()``."""

    def __init__(self, pipeline: EnqueuePipeline, queue: str, *, window: int = 4,
                 priority: int = 0, delay_s: float = 0.0, key: str | None = None,
                 coalesce: bool = False) -> None:
        self.pipeline = pipeline
        self.queue = queue
        self.opts = EnqueueOptions.make(priority, delay_s, None, key, coalesce)
        self.window = Window(pipeline, window)

    def __enter__(self) -> "Producer":
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
