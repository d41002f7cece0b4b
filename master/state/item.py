"""One committed item's metadata and one named queue's in-memory structures."""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, NamedTuple

from master.state.queue_config import QueueConfig
from master.state.ready import ReadyLine

READY, DELAYED, LEASED = 0, 1, 2


class Item(NamedTuple):
    """One committed item's metadata (payload bytes live on data nodes), as an immutable record.

    A change stores a new record under the item's id. That is what lets the queues' lines hold
    the records themselves: an entry is current exactly when ``state.items[entry.id] is entry``,
    with no generation counter and no entry tuple per item. With a million items waiting, the
    master's memory is mostly these records, so what only some items need lives in the state's
    side tables instead of here: lease tokens and deadlines (``held``), delayed items' times
    (``delays``), dead items' origin and last errors.

    The first two fields are the serving order within a queue (lowest priority first, then
    FIFO by ``order``: the id, or for a coalesced item the place in line it inherited).
    """

    priority: int
    order: int
    id: int
    queue: str
    size: int
    crc: int
    key: str  # "": no key
    nodes: tuple[str, ...]  # confirmed replicas
    enqueued_at: float
    attempts: int = 0
    status: int = READY  # last, for with_status

    def with_status(self, status: int) -> Item:
        """This record with another status: the common change, made without ``_replace``'s
        keyword handling (a third of the time; it runs for every lease)."""
        return tuple.__new__(Item, self[:-1] + (status,))


_GETTERS = {name: itemgetter(k) for k, name in enumerate(Item._fields)}


def columns(records: list[Item], *names: str) -> list[list[Any]]:
    """The named fields of the records, a list each (``sizes, crcs = columns(rs, "size",
    "crc")``): one pass in C per field, where a comprehension is a loop of bytecode."""
    return [list(map(_GETTERS[name], records)) for name in names]


@dataclass
class QueueState:
    """One named queue: config, ordered ready items, delayed items, key index, counters."""

    name: str
    config: QueueConfig = field(default_factory=QueueConfig)
    ready: ReadyLine = field(default_factory=ReadyLine)  # records in serving order (some stale)
    delayed: list[tuple[float, Item]] = field(default_factory=list)  # heap of (not_before, record)
    keyed: dict[str, set[int]] = field(default_factory=dict)  # key -> ids in this queue
    active: set[str] = field(default_factory=set)  # keys with a leased item
    n_ready: int = 0
    n_delayed: int = 0
    n_leased: int = 0

    def index(self, item: Item) -> None:
        """Remember the item under its key (what coalescing and key exclusion look up)."""
        if item.key:
            self.keyed.setdefault(item.key, set()).add(item.id)

    def unindex(self, item: Item) -> None:
        if item.key:
            ids = self.keyed.get(item.key)
            if ids is not None:
                ids.discard(item.id)
                if not ids:
                    del self.keyed[item.key]
