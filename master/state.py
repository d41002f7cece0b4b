"""The master's durable state as a pure state machine.

``apply(record)`` is the only way durable state changes; it touches no socket, file or
clock, so replaying the WAL rebuilds exactly the state the live master had. Queries that
depend on time (what is due, what has expired) take ``now`` as an argument.

Order within a queue: lowest priority first, then FIFO by id. Heaps use lazy deletion:
each entry carries the generation the item had when it was pushed, and entries whose item
has moved on are dropped when they reach the top.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field

from master.records import (AckItems, AddReplicas, CommitItems, DropReplicas, LeaseItems, NodeSeen,
                            ReleaseItems, Reserve)

READY, DELAYED, LEASED = 0, 1, 2
RECENT_LEASES = 4096  # lease calls remembered for retries
RECENT_COMMITS = 16384  # commit calls remembered for retries


class Item:
    """One committed item's metadata (payload bytes live on data nodes)."""

    __slots__ = ("id", "queue", "size", "crc", "priority", "nodes", "attempts",
                 "enqueued_at", "status", "gen", "lease", "lease_deadline", "not_before")

    def __init__(self, id: int, queue: str, size: int, crc: int, priority: int,
                 nodes: tuple[str, ...], enqueued_at: float) -> None:
        self.id = id
        self.queue = queue
        self.size = size
        self.crc = crc
        self.priority = priority
        self.nodes = nodes
        self.attempts = 0
        self.enqueued_at = enqueued_at
        self.status = READY
        self.gen = 0
        self.lease = 0
        self.lease_deadline = 0.0
        self.not_before = 0.0

    def snapshot(self) -> tuple:
        return (self.id, self.queue, self.size, self.crc, self.priority, self.nodes, self.attempts,
                self.enqueued_at, self.status, self.lease, self.lease_deadline, self.not_before)


@dataclass
class QueueState:
    """One named queue: ordered ready items, delayed items, and counters."""

    name: str
    ready: list = field(default_factory=list)  # heap of (priority, id, gen)
    delayed: list = field(default_factory=list)  # heap of (not_before, id, gen)
    n_ready: int = 0
    n_delayed: int = 0
    n_leased: int = 0


class State:
    """Everything the master must not forget: items, queues, leases, the id high-water mark."""

    def __init__(self) -> None:
        self.id_hi = 1
        self.lease_seq = 0
        self.items: dict[int, Item] = {}
        self.queues: dict[str, QueueState] = {}
        self.expiries: list = []  # heap of (lease_deadline, id, lease)
        self.node_addrs: dict[str, str] = {}
        self.recent_leases: OrderedDict[str, tuple[list[int], list[int]]] = OrderedDict()
        self.recent_commits: OrderedDict[str, None] = OrderedDict()

    # -- applying records -------------------------------------------------------------------

    def apply(self, rec: object) -> None:
        handler = self._APPLY[type(rec)]
        handler(self, rec)

    def _apply_reserve(self, rec: Reserve) -> None:
        self.id_hi = max(self.id_hi, rec.id_hi)

    def _apply_commit(self, rec: CommitItems) -> None:
        if rec.request:
            self.recent_commits[rec.request] = None
            if len(self.recent_commits) > RECENT_COMMITS:
                self.recent_commits.popitem(last=False)
        q = self.queue(rec.queue)
        nodes = tuple(rec.nodes)
        for i, item_id in enumerate(rec.ids):
            if item_id in self.items:
                continue
            item = Item(item_id, rec.queue, rec.sizes[i], rec.crcs[i], rec.priorities[i], nodes, rec.at)
            self.items[item_id] = item
            self._make_ready(q, item)
            self.id_hi = max(self.id_hi, item_id + 1)

    def _apply_lease(self, rec: LeaseItems) -> None:
        for item_id, lease in zip(rec.ids, rec.leases):
            item = self.items[item_id]
            q = self.queues[item.queue]
            self._leave(q, item)
            item.status = LEASED
            item.lease = lease
            item.lease_deadline = rec.deadline
            q.n_leased += 1
            heapq.heappush(self.expiries, (rec.deadline, item_id, lease))
            self.lease_seq = max(self.lease_seq, lease)
        if rec.request:
            self.recent_leases[rec.request] = (rec.ids, rec.leases)
            if len(self.recent_leases) > RECENT_LEASES:
                self.recent_leases.popitem(last=False)

    def _apply_ack(self, rec: AckItems) -> None:
        for item_id in rec.ids:
            item = self.items.pop(item_id, None)
            if item is not None:
                self._leave(self.queues[item.queue], item)

    def _apply_release(self, rec: ReleaseItems) -> None:
        for item_id in rec.ids:
            item = self.items[item_id]
            q = self.queues[item.queue]
            self._leave(q, item)
            item.attempts += 1
            item.lease = 0
            if rec.not_before > 0:
                item.not_before = rec.not_before
                item.status = DELAYED
                item.gen += 1
                q.n_delayed += 1
                heapq.heappush(q.delayed, (rec.not_before, item_id, item.gen))
            else:
                self._make_ready(q, item)

    def _apply_node_seen(self, rec: NodeSeen) -> None:
        self.node_addrs[rec.node_id] = rec.addr

    def _apply_add_replicas(self, rec: AddReplicas) -> None:
        for item_id in rec.ids:
            item = self.items.get(item_id)
            if item is not None and rec.node not in item.nodes:
                item.nodes = item.nodes + (rec.node,)

    def _apply_drop_replicas(self, rec: DropReplicas) -> None:
        for item_id in rec.ids:
            item = self.items.get(item_id)
            if item is not None and rec.node in item.nodes:
                item.nodes = tuple(n for n in item.nodes if n != rec.node)

    _APPLY = {
        AddReplicas: _apply_add_replicas,
        DropReplicas: _apply_drop_replicas,
        NodeSeen: _apply_node_seen,
        Reserve: _apply_reserve,
        CommitItems: _apply_commit,
        LeaseItems: _apply_lease,
        AckItems: _apply_ack,
        ReleaseItems: _apply_release,
    }

    # -- helpers ---------------------------------------------------------------------------

    def queue(self, name: str) -> QueueState:
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = QueueState(name)
        return q

    def _make_ready(self, q: QueueState, item: Item) -> None:
        item.status = READY
        item.gen += 1
        q.n_ready += 1
        heapq.heappush(q.ready, (item.priority, item.id, item.gen))

    def _leave(self, q: QueueState, item: Item) -> None:
        """Take the item out of whatever counter its status puts it in."""
        if item.status == READY:
            q.n_ready -= 1
        elif item.status == DELAYED:
            q.n_delayed -= 1
        else:
            q.n_leased -= 1
        item.gen += 1  # invalidates its heap entries

    # -- pure queries (time is passed in) ----------------------------------------------------

    def promote_due(self, q: QueueState, now: float) -> None:
        """Move delayed items whose time has come into the ready heap."""
        while q.delayed:
            not_before, item_id, gen = q.delayed[0]
            item = self.items.get(item_id)
            if item is None or item.gen != gen:
                heapq.heappop(q.delayed)
                continue
            if not_before > now:
                break
            heapq.heappop(q.delayed)
            q.n_delayed -= 1
            self._make_ready(q, item)

    def head(self, name: str, n: int, now: float) -> list[int]:
        """The ids a lease of ``n`` would take right now, in serving order."""
        q = self.queues.get(name)
        if q is None:
            return []
        self.promote_due(q, now)
        heap = q.ready
        taken: list[tuple] = []
        while heap and len(taken) < n:
            entry = heapq.heappop(heap)
            item = self.items.get(entry[1])
            if item is not None and item.gen == entry[2]:
                taken.append(entry)
        for entry in taken:  # a query must not change the heap's contents
            heapq.heappush(heap, entry)
        return [e[1] for e in taken]

    def expired(self, now: float, limit: int = 10_000) -> list[int]:
        """Ids whose lease deadline has passed (at most ``limit``)."""
        out: list[int] = []
        heap = self.expiries
        while heap and len(out) < limit:
            deadline, item_id, lease = heap[0]
            item = self.items.get(item_id)
            if item is None or item.status != LEASED or item.lease != lease \
                    or item.lease_deadline != deadline:  # settled, re-leased or extended
                heapq.heappop(heap)
                continue
            if deadline > now:
                break
            heapq.heappop(heap)
            out.append(item_id)
        return out

    def next_expiry(self) -> float | None:
        return self.expiries[0][0] if self.expiries else None

    def leased_by(self, request: str) -> list[int]:
        """Items a lease call with this request id obtained and still holds (for retries)."""
        ids, leases = self.recent_leases.get(request, ((), ()))
        out = []
        for item_id, lease in zip(ids, leases):
            item = self.items.get(item_id)
            if item is not None and item.status == LEASED and item.lease == lease:
                out.append(item_id)
        return out

    # -- checkpoints -------------------------------------------------------------------------

    def export(self) -> list:
        """Everything durable as plain lists (msgpack-able), for a checkpoint."""
        items = [[i.id, i.queue, i.size, i.crc, i.priority, list(i.nodes), i.attempts,
                  i.enqueued_at, i.status, i.lease, i.lease_deadline, i.not_before]
                 for i in self.items.values()]
        return [self.id_hi, self.lease_seq, self.node_addrs,
                [[k, list(v[0]), list(v[1])] for k, v in self.recent_leases.items()],
                list(self.recent_commits), items]

    @classmethod
    def restore(cls, data: list) -> "State":
        """Rebuild a state from ``export()``'s output; heaps are rebuilt in one pass each."""
        s = cls()
        s.id_hi, s.lease_seq, s.node_addrs, recent, commits, items = data
        s.recent_leases = OrderedDict((k, (ids, leases)) for k, ids, leases in recent)
        s.recent_commits = OrderedDict.fromkeys(commits)
        queues = s.queues
        for row in items:
            item = Item(row[0], row[1], row[2], row[3], row[4], tuple(row[5]), row[7])
            item.attempts, item.status, item.lease, item.lease_deadline, item.not_before = row[6], row[8], row[9], row[10], row[11]
            s.items[item.id] = item
            q = queues.get(item.queue)
            if q is None:
                q = queues[item.queue] = QueueState(item.queue)
            if item.status == READY:
                q.n_ready += 1
                q.ready.append((item.priority, item.id, 0))
            elif item.status == DELAYED:
                q.n_delayed += 1
                q.delayed.append((item.not_before, item.id, 0))
            else:
                q.n_leased += 1
                s.expiries.append((item.lease_deadline, item.id, item.lease))
        for q in queues.values():
            heapq.heapify(q.ready)
            heapq.heapify(q.delayed)
        heapq.heapify(s.expiries)
        return s

    def snapshot(self) -> tuple:
        """A comparable picture of the durable state (tests compare live and replayed)."""
        return (self.id_hi, self.lease_seq, sorted(self.node_addrs.items()),
                list(self.recent_leases.items()), list(self.recent_commits), sorted(i.snapshot() for i in self.items.values()),
                sorted((q.name, q.n_ready, q.n_delayed, q.n_leased) for q in self.queues.values()))
