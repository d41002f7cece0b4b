"""What the client hands out: leased items, messages, enqueue options, the batch consumer."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from blizzard import protocol as p
from blizzard.errors import InvalidArgument

if TYPE_CHECKING:
    from blizzard.client import Client


@dataclass(slots=True)
class LeasedItem:
    """A leased item as the master described it: where its replicas are, what to check.

    Picklable, so a driver can lease and hand items to workers that ``fetch`` them.
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


@dataclass(slots=True)
class Message:
    """A leased item. ``ack()`` when done; ``nack()`` to give it back; or use it as a context manager."""

    id: int
    data: bytes
    queue: str
    attempts: int
    priority: int
    enqueued_at: float
    lease: int
    _client: Client

    def ack(self) -> None:
        self._client.ack_many([self])

    def nack(self, delay_s: float | None = None, error: str = "") -> None:
        """Give the item back: after ``delay_s``, or (None) after the queue's retry back-off.

        ``error`` is kept with the item and shown if it ends up dead-lettered.
        """
        self._client.nack_many([self], delay_s=delay_s, error=error)

    def extend(self, lease_s: float) -> None:
        """Keep the lease for ``lease_s`` more seconds from now (a long job's touch)."""
        self._client.extend_many([self], lease_s=lease_s)

    def __enter__(self) -> "Message":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.ack()
        else:
            self.nack(error=f"{exc_type.__name__}: {exc}")


@dataclass(frozen=True)
class EnqueueOptions:
    """Per-call enqueue options (see ``Client.enqueue``), checked before anything is sent."""

    priority: int = 0
    delay_s: float = 0.0
    key: str = ""
    coalesce: bool = False

    @classmethod
    def make(cls, priority: Any = 0, delay_s: Any = 0.0, not_before: Any = None, key: Any = None,
             coalesce: Any = False) -> "EnqueueOptions":
        if type(priority) is not int:
            raise InvalidArgument(f"priority must be an integer, got {type(priority).__name__}")
        if isinstance(delay_s, bool) or not isinstance(delay_s, (int, float)) or delay_s < 0:
            raise InvalidArgument(f"delay_s must be a non-negative number, got {delay_s!r}")
        if not_before is not None:
            if delay_s:
                raise InvalidArgument("give delay_s or not_before, not both")
            stamp = not_before.timestamp() if hasattr(not_before, "timestamp") else not_before
            if isinstance(stamp, bool) or not isinstance(stamp, (int, float)):
                raise InvalidArgument("not_before must be a datetime or a unix timestamp")
            delay_s = max(0.0, stamp - time.time())
        if key is not None and not isinstance(key, str):
            raise InvalidArgument(f"key must be a string, got {type(key).__name__}")
        if coalesce and not key:
            raise InvalidArgument("coalesce=True needs a key")
        return cls(priority, float(delay_s), key or "", bool(coalesce))


def as_bytes(data: Any) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"payloads must be bytes, not {type(data).__name__} (encode text first)")



class Consumer:
    """Iterate batches of messages with acks piggybacked on the next lease (see ``Client.consume``)."""

    def __init__(self, client: Client, queue: str, n: int, lease_s: float | None,
                 wait_s: float) -> None:
        self.client, self.queue, self.n, self.lease_s, self.wait_s = client, queue, n, lease_s, wait_s
        self.current: list[Message] = []
        self.stopped = False

    def __enter__(self) -> "Consumer":
        return self

    def __iter__(self) -> "Consumer":
        return self

    def __next__(self) -> list[Message]:
        """The next non-empty batch (waiting up to ``wait_s`` at a time); stops once stopped."""
        while not self.stopped:
            done, self.current = self.current, []
            self.current = self.client.dequeue_many(self.queue, self.n, lease_s=self.lease_s,
                                                    wait_s=self.wait_s, ack=done)
            if self.current:
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

