"""One committed item's metadata and one named queue's in-memory structures."""

from __future__ import annotations

from dataclasses import dataclass, field

from master.queues import QueueConfig

READY, DELAYED, LEASED = 0, 1, 2


class Item:
    """One committed item's metadata (payload bytes live on data nodes)."""

    __slots__ = ("id", "queue", "size", "crc", "priority", "order", "key", "nodes", "attempts",
                 "enqueued_at", "status", "gen", "lease", "lease_deadline", "not_before",
                 "origin", "error")

    def __init__(self, id: int, queue: str, size: int, crc: int, priority: int,
                 nodes: tuple[str, ...], enqueued_at: float, key: str = "") -> None:
        self.id = id
        self.queue = queue
        self.size = size
        self.crc = crc
        self.priority = priority
        self.order = id
        self.key = key
        self.nodes = nodes
        self.attempts = 0
        self.enqueued_at = enqueued_at
        self.status = READY
        self.gen = 0
        self.lease = 0
        self.lease_deadline = 0.0
        self.not_before = 0.0
        self.origin = ""  # the queue it died in, while it sits in a dead-letter queue
        self.error = ""  # the last error a consumer gave

    def export(self) -> list:
        return [self.id, self.queue, self.size, self.crc, self.priority, self.order, self.key,
                list(self.nodes), self.attempts, self.enqueued_at, self.status, self.lease,
                self.lease_deadline, self.not_before, self.origin, self.error]

    @classmethod
    def restore(cls, row: list) -> "Item":
        item = cls(row[0], row[1], row[2], row[3], row[4], row[7], row[9], row[6])
        (item.order, item.attempts, item.status, item.lease, item.lease_deadline,
         item.not_before, item.origin, item.error) = (row[5], row[8], row[10], row[11], row[12],
                                                      row[13], row[14], row[15])
        return item


@dataclass
class QueueState:
    """One named queue: config, ordered ready items, delayed items, key index, counters."""

    name: str
    config: QueueConfig = field(default_factory=QueueConfig)
    ready: list = field(default_factory=list)  # heap of (priority, order, id, gen)
    delayed: list = field(default_factory=list)  # heap of (not_before, id, gen)
    keyed: dict[str, set[int]] = field(default_factory=dict)  # key -> ids in this queue
    active: set[str] = field(default_factory=set)  # keys with a leased item
    n_ready: int = 0
    n_delayed: int = 0
    n_leased: int = 0
