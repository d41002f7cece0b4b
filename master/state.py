"""The master's durable state as a pure state machine.

``apply(record)`` is the only way durable state changes; it touches no socket, file or
clock, so replaying the WAL rebuilds exactly the state the live master had. Queries that
depend on time (what is due, what has expired) take ``now`` as an argument.

Order within a queue: lowest priority first, then FIFO by ``order`` (the id, or for a
coalesced item the place in line it inherited). Items sharing a key are never leased at
the same time. Heaps use lazy deletion: each entry carries the generation the item had when
it was pushed, and entries whose item has moved on are dropped when they reach the top.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import Iterable, Iterator

from master.item import DELAYED, LEASED, READY, Item, QueueState
from master.queues import QueueConfig
from master.records import (AckItems, AddReplicas, CommitItems, ConfigureQueue, DropReplicas,
                            LeaseItems, NodeSeen, RedriveItems, ReleaseItems, Reserve)

RECENT_LEASES = 4096  # lease calls remembered for retries
RECENT_COMMITS = 16384  # commit calls remembered for retries
RECENT_ACKS = 100_000  # acked (id, lease) pairs: a retried ack succeeds, someone else's stale one not


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
        self.recent_acks: OrderedDict[int, int] = OrderedDict()  # id -> lease it was acked under

    # -- applying records -------------------------------------------------------------------

    def apply(self, rec: object) -> None:
        self._APPLY[type(rec)](self, rec)

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
            item = Item(item_id, rec.queue, rec.sizes[i], rec.crcs[i], rec.priorities[i], nodes,
                        rec.at, rec.keys[i])
            if rec.coalesce and item.key:
                for old in self.waiting_with_key(rec.queue, item.key):
                    item.priority = min(item.priority, old.priority)
                    item.order = min(item.order, old.order)
                    self._forget(old)
            self.items[item_id] = item
            self._place(q, item, rec.not_befores[i])
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
            if item.key:
                q.active.add(item.key)
            heapq.heappush(self.expiries, (rec.deadline, item_id, lease))
            self.lease_seq = max(self.lease_seq, lease)
        if rec.request:
            self.recent_leases[rec.request] = (rec.ids, rec.leases)
            if len(self.recent_leases) > RECENT_LEASES:
                self.recent_leases.popitem(last=False)

    def _apply_ack(self, rec: AckItems) -> None:
        for item_id in rec.ids:
            item = self.items.get(item_id)
            if item is not None:
                if item.status == LEASED:
                    self.recent_acks[item_id] = item.lease
                    if len(self.recent_acks) > RECENT_ACKS:
                        self.recent_acks.popitem(last=False)
                self._forget(item)

    def _apply_release(self, rec: ReleaseItems) -> None:
        for item_id, not_before in zip(rec.ids, rec.not_befores):
            item = self.items[item_id]
            q = self.queues[item.queue]
            self._leave(q, item)
            item.attempts += 1
            item.lease = 0
            if rec.error:
                item.error = rec.error
            limit = q.config.max_attempts
            if limit and item.attempts >= limit and not item.origin:  # dead items stay put
                self._unindex(q, item)
                item.origin = item.queue
                item.queue = q.config.dead_letter_queue(q.name)
                self._place(self.queue(item.queue), item, 0.0)
            else:
                self._place(q, item, not_before)

    def _apply_redrive(self, rec: RedriveItems) -> None:
        for item_id in rec.ids:
            item = self.items.get(item_id)
            if item is None or not item.origin or item.status == LEASED:
                continue
            q = self.queues[item.queue]
            self._leave(q, item)
            self._unindex(q, item)
            item.queue, item.origin, item.attempts, item.error = item.origin, "", 0, ""
            self._place(self.queue(item.queue), item, 0.0)

    def _apply_configure(self, rec: ConfigureQueue) -> None:
        self.queue(rec.queue).config = QueueConfig(
            **{name: getattr(rec, name) for name in QueueConfig.option_names()})

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
        Reserve: _apply_reserve,
        CommitItems: _apply_commit,
        LeaseItems: _apply_lease,
        AckItems: _apply_ack,
        ReleaseItems: _apply_release,
        RedriveItems: _apply_redrive,
        ConfigureQueue: _apply_configure,
        NodeSeen: _apply_node_seen,
        AddReplicas: _apply_add_replicas,
        DropReplicas: _apply_drop_replicas,
    }

    # -- helpers ---------------------------------------------------------------------------

    def queue(self, name: str) -> QueueState:
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = QueueState(name)
        return q

    def config(self, name: str) -> QueueConfig:
        q = self.queues.get(name)
        return q.config if q is not None else QueueConfig()

    def _place(self, q: QueueState, item: Item, not_before: float) -> None:
        """Put an item in line: ready now, or delayed until ``not_before``."""
        item.gen += 1
        self._index(q, item)
        if not_before > 0:
            item.status = DELAYED
            item.not_before = not_before
            q.n_delayed += 1
            heapq.heappush(q.delayed, (not_before, item.id, item.gen))
        else:
            item.status = READY
            q.n_ready += 1
            heapq.heappush(q.ready, (item.priority, item.order, item.id, item.gen))

    def _index(self, q: QueueState, item: Item) -> None:
        if item.key:
            q.keyed.setdefault(item.key, set()).add(item.id)

    def _unindex(self, q: QueueState, item: Item) -> None:
        if item.key:
            ids = q.keyed.get(item.key)
            if ids is not None:
                ids.discard(item.id)
                if not ids:
                    del q.keyed[item.key]

    def _leave(self, q: QueueState, item: Item) -> None:
        """Take the item out of whatever counter its status puts it in."""
        if item.status == READY:
            q.n_ready -= 1
        elif item.status == DELAYED:
            q.n_delayed -= 1
        else:
            q.n_leased -= 1
            if item.key:
                q.active.discard(item.key)
        item.status = READY  # provisional: the caller places it again or forgets it
        item.gen += 1  # invalidates its heap entries

    def _forget(self, item: Item) -> None:
        q = self.queues[item.queue]
        self._leave(q, item)
        self._unindex(q, item)
        del self.items[item.id]

    # -- pure queries (time is passed in) ----------------------------------------------------

    def waiting_with_key(self, queue: str, key: str) -> list[Item]:
        """Items of ``queue`` with ``key`` that are not leased (what coalescing replaces)."""
        q = self.queues.get(queue)
        if q is None:
            return []
        return [self.items[i] for i in sorted(q.keyed.get(key, ())) if self.items[i].status != LEASED]

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
            item.gen += 1
            item.status = READY
            q.n_ready += 1
            heapq.heappush(q.ready, (item.priority, item.order, item.id, item.gen))

    def head(self, name: str, n: int, now: float) -> list[int]:
        """The ids a lease of ``n`` would take right now, in serving order.

        An item whose key is leased, or already taken earlier in this batch, is passed over.
        """
        q = self.queues.get(name)
        if q is None:
            return []
        self.promote_due(q, now)
        heap = q.ready
        popped: list[tuple] = []
        taken: list[int] = []
        keys: set[str] = set()
        while heap and len(taken) < n:
            entry = heapq.heappop(heap)
            item = self.items.get(entry[2])
            if item is None or item.gen != entry[3]:
                continue
            popped.append(entry)
            if item.key:
                if item.key in q.active or item.key in keys:
                    continue
                keys.add(item.key)
            taken.append(item.id)
        for entry in popped:  # a query must not change the heap's contents
            heapq.heappush(heap, entry)
        return taken

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

    def export_parts(self) -> Iterator[list]:
        """Everything durable as plain lists (msgpack-able), for a checkpoint: a header, then
        one row per item, so neither writing nor reading needs it all in memory at once."""
        configs = [[q.name, *[getattr(q.config, f) for f in QueueConfig.option_names()]]
                   for q in self.queues.values()]
        yield [self.id_hi, self.lease_seq, self.node_addrs,
               [[k, list(v[0]), list(v[1])] for k, v in self.recent_leases.items()],
               list(self.recent_commits), configs, list(self.recent_acks.items()), len(self.items)]
        for item in self.items.values():
            yield item.export()

    @classmethod
    def restore(cls, parts: Iterable[list]) -> "State":
        """Rebuild a state from ``export_parts()``; heaps are rebuilt in one pass each."""
        s = cls()
        parts = iter(parts)
        s.id_hi, s.lease_seq, s.node_addrs, recent, commits, configs, acks, count = next(parts)
        s.recent_acks = OrderedDict((i, lease) for i, lease in acks)
        s.recent_leases = OrderedDict((k, (ids, leases)) for k, ids, leases in recent)
        s.recent_commits = OrderedDict.fromkeys(commits)
        for name, *values in configs:
            s.queue(name).config = QueueConfig(*values)
        shared: dict = {}  # one copy of each queue name and replica tuple, not one per item
        for row in parts:
            row[1] = shared.setdefault(row[1], row[1])
            row[7] = shared.setdefault(tuple(row[7]), tuple(row[7]))
            item = Item.restore(row)
            s.items[item.id] = item
            q = s.queue(item.queue)
            s._index(q, item)
            if item.status == READY:
                q.n_ready += 1
                q.ready.append((item.priority, item.order, item.id, 0))
            elif item.status == DELAYED:
                q.n_delayed += 1
                q.delayed.append((item.not_before, item.id, 0))
            else:
                q.n_leased += 1
                if item.key:
                    q.active.add(item.key)
                s.expiries.append((item.lease_deadline, item.id, item.lease))
        for q in s.queues.values():
            heapq.heapify(q.ready)
            heapq.heapify(q.delayed)
        heapq.heapify(s.expiries)
        if len(s.items) != count:
            raise ValueError(f"checkpoint holds {len(s.items)} items, its header says {count}")
        return s

    def snapshot(self) -> tuple:
        """A comparable picture of the durable state (tests compare live and replayed)."""
        return (self.id_hi, self.lease_seq, sorted(self.node_addrs.items()),
                list(self.recent_leases.items()), list(self.recent_commits),
                list(self.recent_acks.items()),
                sorted(i.export() for i in self.items.values()),
                sorted((q.name, q.config, q.n_ready, q.n_delayed, q.n_leased, sorted(q.active),
                        sorted((k, sorted(v)) for k, v in q.keyed.items()))
                       for q in self.queues.values()))
