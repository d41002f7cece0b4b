"""Batches of messages with each batch's ack riding on the next lease (``Client.consume``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from blizzard.client.message import Message


class Dequeues(Protocol):
    """The client calls a consumer needs."""

    def dequeue_many(self, queue: str, n: int, *, lease_s: float | None = None,
                     wait_s: float = 0.0, ack: Sequence[Message] = ()) -> list[Message]: ...

    def ack_many(self, msgs: Sequence[Any]) -> None: ...

    def nack_many(self, msgs: Sequence[Any], *, delay_s: float | None = None,
                  error: str = "") -> None: ...


class Consumer:
    """Iterate batches of messages with acks piggybacked on the next lease (see
    ``Client.consume``)."""

    def __init__(self, client: Dequeues, queue: str, n: int, lease_s: float | None,
                 wait_s: float) -> None:
        self.client, self.queue, self.n = client, queue, n
        self.lease_s, self.wait_s = lease_s, wait_s
        self.current: list[Message] = []
        self.stopped = False

    def __enter__(self) -> Consumer:
        return self

    def __iter__(self) -> Consumer:
        return self

    def __next__(self) -> list[Message]:
        """The next non-empty batch (waiting up to ``wait_s`` at a time); stops once stopped."""
        while not self.stopped:
            if self.next_batch():
                return self.current
        raise StopIteration

    def next_batch(self) -> list[Message]:
        """Ack the current batch and lease the next (possibly empty after ``wait_s``)."""
        done, self.current = self.current, []
        self.current = self.client.dequeue_many(self.queue, self.n, lease_s=self.lease_s,
                                                wait_s=self.wait_s, ack=done)
        return self.current

    def stop(self) -> None:
        self.stopped = True

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.current:
            if exc_type is None:
                self.client.ack_many(self.current)
            else:
                self.client.nack_many(self.current)
            self.current = []
