"""The master's durable state as a pure state machine.

``apply(record)`` is the only way durable state changes; it touches no socket, file or
clock, so replaying the WAL rebuilds exactly the state the live master had. Queries that
depend on time (what is due, what has expired) take ``now`` as an argument.

Order within a queue: lowest priority first, then FIFO by ``order`` (the id, or for a
coalesced item the place in line it inherited). Items sharing a key are never leased at
the same time. The ready lines (``master/state/ready.py``) and heaps hold the item records
themselves and use lazy deletion: a change stores a new record, and an entry that is no longer
its item's record is dropped when it reaches the front.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from typing import Any

from master.state import checkpoint_layout as schema
from master.state import job_records, picking
from master.state.expiries import Expiries
from master.state.item import DELAYED, LEASED, READY, Item, QueueState
from master.state.job_book import RESULT_DONE, JobBook
from master.state.queue_config import QueueConfig
from master.state.ready import ReadyLine
from master.state.records import (
    AckItems,
    AddReplicas,
    AddSchedule,
    BuryItems,
    CancelItems,
    ClusterCreated,
    CommitItems,
    ConfigureQueue,
    DeleteItems,
    DeleteQueue,
    DropReplicas,
    DropSchedule,
    EpochBegun,
    ExpireUniques,
    ForgetNode,
    ForgetResults,
    LeaseItems,
    NodeKeyBound,
    NodeSeen,
    ProgressItems,
    RearmItems,
    RebuildItems,
    RedriveItems,
    ReleaseItems,
    Reserve,
    StandbySynced,
    WakeItems,
)
from master.state.schedule_book import ScheduleBook
from master.state.unique_keys import Uniques

RECENT_LEASES = 4096  # lease calls remembered for retries
RECENT_COMMITS = 16384  # commit calls remembered for retries
# acked (id, lease) pairs: a retried ack succeeds, someone else's stale one not
RECENT_ACKS = 100_000


class State:
    """Everything the master must not forget: items, queues, leases, the id high-water mark."""

    def __init__(self) -> None:
        self.id_hi = 1
        self.lease_seq = 0  # the highest lease token seen (tokens are random: a checkpoint field)
        self.cluster_id = ""  # made at the master's first start (``ClusterCreated``)
        self.epoch, self.standby = 0, ("", "")  # promotions; the sync standby's (name, address)
        self.items: dict[int, Item] = {}
        self.queues: dict[str, QueueState] = {}
        self.held: dict[int, tuple[int, float]] = {}  # leased id -> (lease token, deadline)
        self.delays: dict[int, float] = {}  # delayed id -> not-before time
        self.origins: dict[int, str] = {}  # dead id -> the queue it died in
        self.errors: dict[int, str] = {}  # id -> the last error a consumer gave
        self.ttrs: dict[int, float] = {}  # id -> its own lease length (beanstalkd's ttr)
        # id -> the token it was last leased under, since given back and not leased again: a
        # late ack under it may still finish the item (``Ack.late``; not checkpointed)
        self.lapsed: dict[int, int] = {}
        self.expiries = Expiries()  # when leases run out
        self.node_addrs: dict[str, str] = {}
        self.node_keys: dict[str, str] = {}  # node id -> the public key it speaks with (z85)
        self.recent_leases: OrderedDict[str, tuple[list[int], list[int]]] = OrderedDict()
        self.recent_commits: OrderedDict[str, None] = OrderedDict()
        self.recent_acks: OrderedDict[int, int] = OrderedDict()  # id -> lease it was acked under
        self.uniques = Uniques()  # unique keys taken (master/state/unique_keys.py)
        self.jobs = JobBook()  # results, cancellations, progress (master/state/job_book.py)
        # jobs with dependents that ended while a record applied: (id, done), settled after it
        self._ended: list[tuple[int, bool]] = []
        self.schedules = ScheduleBook()  # re-armed items (master/state/schedule_book.py)
        self._replica_sets: dict[tuple[str, ...], tuple[str, ...]] = {}

    # -- applying records -------------------------------------------------------------------

    def apply(self, rec: object) -> None:
        _APPLY[type(rec)](self, rec)
        if self._ended:  # dependencies settled after the record's own loop, never inside it
            job_records.settle_dependencies(self)

    def _apply_reserve(self, rec: Reserve) -> None:
        self.id_hi = max(self.id_hi, rec.id_hi)

    def _apply_commit(self, rec: CommitItems) -> None:
        if rec.request:
            self.recent_commits[rec.request] = None
            if len(self.recent_commits) > RECENT_COMMITS:
                self.recent_commits.popitem(last=False)
        q = self.queue(rec.queue)
        nodes = self.replica_set(rec.nodes)
        make = tuple.__new__  # Item(...) without the keyword handling: this runs per item
        for i, item_id in enumerate(rec.ids):
            if item_id in self.items:
                continue
            priority, order, key = rec.priorities[i], item_id, rec.keys[i]
            if rec.coalesce and key:
                for old in self.waiting_with_key(rec.queue, key):
                    priority = min(priority, old.priority)
                    order = min(order, old.order)
                    if self.jobs.dependents:  # what waited on it waits on its replacement
                        self.jobs.transfer(old.id, item_id)
                    self.forget(old)
            item = make(Item, (priority, order, item_id, q.name, rec.sizes[i], rec.crcs[i], key,
                               nodes, rec.at, 0, DELAYED if rec.not_befores[i] > 0 else READY))
            self._enter(q, item, rec.not_befores[i])
            self.id_hi = max(self.id_hi, item_id + 1)
        if rec.ttrs:
            for item_id, ttr in zip(rec.ids, rec.ttrs, strict=True):
                if ttr and item_id in self.items:
                    self.ttrs[item_id] = ttr
        if rec.uniques:
            self.uniques.expire(rec.at)
            for item_id, key in zip(rec.ids, rec.uniques, strict=True):
                if key:
                    self.uniques.take(rec.queue, key, item_id, rec.unique_until)
        if rec.depends_on:
            job_records.hold_for(self, rec)
        if rec.result_of:
            for item_id, job in zip(rec.ids, rec.result_of, strict=True):
                if item_id in self.items and item_id not in self.jobs.result_jobs:
                    replaced = self.jobs.link(job, item_id, rec.result_kind)
                    if replaced is not None and replaced in self.items:
                        self.forget(self.items[replaced])

    def _apply_lease(self, rec: LeaseItems) -> None:
        """Lease ready items, or extend leased ones. It runs for every item a consumer takes,
        so the common case (a ready item) is written out here, and the whole record gets one
        expiry entry."""
        items, held, queues, deadline = self.items, self.held, self.queues, rec.deadline
        make = tuple.__new__
        q = None
        if rec.deadlines:  # items with leases of their own: each its deadline
            self._apply_lease_each(rec)
            return
        for item_id, lease in zip(rec.ids, rec.leases, strict=True):
            item = items[item_id]
            if q is None or q.name != item.queue:
                q = queues[item.queue]
            if item.status != LEASED:  # else an extension: record, count and key stay as they are
                if self.lapsed:
                    self.lapsed.pop(item_id, None)
                if item.status == READY:
                    q.n_ready -= 1
                else:
                    self._leave(q, item)
                items[item_id] = item = make(Item, item[:-1] + (LEASED,))  # with_status, inline
                q.n_leased += 1
            held[item_id] = (lease, deadline)
            if item.key:
                q.active.add(item.key)
        if rec.ids:
            self.lease_seq = max(self.lease_seq, max(rec.leases))
            self.expiries.add(deadline, rec.ids, rec.leases)
        if rec.request:
            self.recent_leases[rec.request] = (rec.ids, rec.leases)
            if len(self.recent_leases) > RECENT_LEASES:
                self.recent_leases.popitem(last=False)

    def _apply_lease_each(self, rec: LeaseItems) -> None:
        """``_apply_lease`` for a record whose items end their leases at different times."""
        by_end: dict[float, list[int]] = {}
        for k, end in enumerate(rec.deadlines):
            by_end.setdefault(end, []).append(k)
        for end, at in by_end.items():
            self._apply_lease(LeaseItems(ids=[rec.ids[k] for k in at],
                                         leases=[rec.leases[k] for k in at], deadline=end,
                                         request=""))
        if rec.request:
            self.recent_leases[rec.request] = (rec.ids, rec.leases)
            if len(self.recent_leases) > RECENT_LEASES:
                self.recent_leases.popitem(last=False)

    def _apply_ack(self, rec: AckItems) -> None:
        """Forget acked items, keeping leased ones' tokens (``forget`` written out for a leased
        item: this runs for every item a consumer finishes)."""
        items, held, queues, acks = self.items, self.held, self.queues, self.recent_acks
        origins, errors, ttrs, lapsed = self.origins, self.errors, self.ttrs, self.lapsed
        jobs = self.jobs
        for item_id in rec.ids:
            item = items.get(item_id)
            if item is None:
                continue
            if item.status != LEASED:
                token = lapsed.get(item_id) if lapsed else None
                if token is not None:  # a late ack (``Ack.late``): a retry is answered done
                    acks[item_id] = token
                    if jobs.dependents and item_id in jobs.dependents:
                        self._ended.append((item_id, True))
                self.forget(item)  # else purged: its dependents fail (``forget``)
                continue
            if jobs.cancels and item_id in jobs.cancels:
                result = jobs.results.get(item_id)
                if result is None or result.kind != RESULT_DONE:  # stopped, not finished
                    jobs.cancelled(item_id)
                    if jobs.dependents and item_id in jobs.dependents:
                        self._ended.append((item_id, False))
            if jobs.dependents and item_id in jobs.dependents:
                self._ended.append((item_id, True))
            if jobs.watched:
                jobs.touch(item_id)
            q = queues[item.queue]
            acks[item_id] = held.pop(item_id)[0]
            q.n_leased -= 1
            if item.key:
                q.active.discard(item.key)
                q.unindex(item)
            del items[item_id]
            if origins:
                origins.pop(item_id, None)
            if errors:
                errors.pop(item_id, None)
            if ttrs:
                ttrs.pop(item_id, None)
            if lapsed:
                lapsed.pop(item_id, None)
            if jobs.cancels or jobs.progress:
                jobs.drop(item_id)
        while len(acks) > RECENT_ACKS:  # ids are never acked twice: trimming once is the same
            acks.popitem(last=False)

    def _apply_release(self, rec: ReleaseItems | BuryItems) -> None:
        priorities = rec.priorities
        for k, (item_id, not_before) in enumerate(zip(rec.ids, rec.not_befores, strict=True)):
            item = self.items[item_id]
            if item_id in self.jobs.cancels:  # given back after a cancel: it ends here
                self.forget(item)
                self.jobs.cancelled(item_id)
                continue
            held = self.held.get(item_id)
            if held is not None:
                self.lapsed[item_id] = held[0]
            if priorities and priorities[k] != item.priority:  # beanstalkd's release pri
                item = item._replace(priority=priorities[k])
            q = self.queues[item.queue]
            self._leave(q, item)
            attempts = item.attempts + 1
            if rec.error:
                self.errors[item_id] = rec.error
            limit = 1 if type(rec) is BuryItems else q.config.max_attempts  # buried: none left
            if self.dies(item_id, attempts, limit):
                q.unindex(item)
                self.origins[item_id] = item.queue
                dead = self.queue(q.config.dead_letter_queue(q.name))
                self._place(dead, item, 0.0, queue=dead.name, attempts=attempts)
                self.jobs.drop(item_id)  # a dead job's progress is kept no longer
                self.jobs.touch(item_id)
                if self.jobs.dependents and item_id in self.jobs.dependents:
                    self._ended.append((item_id, False))
            else:
                self._place(q, item, not_before, attempts=attempts)

    def dies(self, item_id: int, attempts: int, limit: int) -> bool:
        """Whether an item given back for the ``attempts``-th time moves to its dead-letter
        queue: its queue's ``limit`` (``max_attempts``; 0: never, a burial: 1) is reached and
        it is not dead already (dead items stay put). The one home of the dead-letter rule."""
        return bool(limit) and attempts >= limit and item_id not in self.origins

    def _apply_redrive(self, rec: RedriveItems) -> None:
        for item_id in rec.ids:
            item = self.items.get(item_id)
            if item is None or item_id not in self.origins or item.status == LEASED:
                continue
            q = self.queues[item.queue]
            self._leave(q, item)
            q.unindex(item)
            home = self.queue(self.origins.pop(item_id))
            self.errors.pop(item_id, None)
            self._place(home, item, 0.0, queue=home.name, attempts=0)

    def _apply_expire_uniques(self, rec: ExpireUniques) -> None:
        self.uniques.expire(rec.at)

    def _apply_wake(self, rec: WakeItems) -> None:
        """Delayed items become ready now; not a job waiting for its dependencies, nor a
        schedule's call before its tick."""
        for item_id in rec.ids:
            item = self.items.get(item_id)
            if item is not None and item.status == DELAYED and item_id not in self.jobs.waiting \
                    and item_id not in self.schedules.by_item:
                q = self.queues[item.queue]
                self._leave(q, item)
                self._place(q, item, 0.0)

    def _apply_configure(self, rec: ConfigureQueue) -> None:
        self.queue(rec.queue).config = QueueConfig(
            **{name: getattr(rec, name) for name in QueueConfig.option_names()})

    def _apply_node_seen(self, rec: NodeSeen) -> None:
        self.node_addrs[rec.node_id] = rec.addr

    def _apply_node_key_bound(self, rec: NodeKeyBound) -> None:
        for node_id in [n for n, key in self.node_keys.items() if key == rec.key]:
            del self.node_keys[node_id]  # a key speaks for one node
        self.node_keys[rec.node_id] = rec.key

    def _apply_add_replicas(self, rec: AddReplicas) -> None:
        for item_id in rec.ids:
            item = self.items.get(item_id)
            if item is not None and rec.node not in item.nodes:
                self.set_nodes(item, item.nodes + (rec.node,))

    def _apply_drop_replicas(self, rec: DropReplicas) -> None:
        for item_id in rec.ids:
            item = self.items.get(item_id)
            if item is not None and rec.node in item.nodes:
                self.set_nodes(item, tuple(n for n in item.nodes if n != rec.node))

    def _apply_rebuild_items(self, rec: RebuildItems) -> None:
        """Items a rebuild from the data nodes made (``master/ha/rebuild.py``): each enters its
        queue in line (by priority, then id), ready or delayed, with its attempts; an id the
        state holds already is left as it is."""
        q = self.queue(rec.queue)
        nodes = self.replica_set(rec.nodes)
        for k, item_id in enumerate(rec.ids):
            if item_id in self.items:
                continue
            not_before = rec.not_befores[k]
            item = Item(rec.priorities[k], item_id, item_id, q.name, rec.sizes[k], rec.crcs[k],
                        rec.keys[k], nodes, rec.at, rec.attempts[k],
                        DELAYED if not_before > 0 else READY)
            self._enter(q, item, not_before)
            if rec.origins[k]:
                self.origins[item_id] = rec.origins[k]
            self.id_hi = max(self.id_hi, item_id + 1)

    # cluster identity and high availability

    def _apply_cluster_created(self, rec: ClusterCreated) -> None:
        """The first id a master made is its cluster's for good."""
        self.cluster_id = self.cluster_id or rec.cluster_id

    def _apply_epoch_begun(self, rec: EpochBegun) -> None:
        """A promotion: the epoch rises and no standby is in sync with the new primary yet."""
        self.epoch = max(self.epoch, rec.epoch)
        self.standby = ("", "")

    def _apply_standby_synced(self, rec: StandbySynced) -> None:
        self.standby = (rec.name, rec.addr)

    # an operator's removals (master/admin/removal.py, master/nodes/blob_deletes.py)

    def _apply_forget_node(self, rec: ForgetNode) -> None:
        """The node is no replica of anything any more; its address is forgotten too."""
        self.node_addrs.pop(rec.node_id, None)
        self.node_keys.pop(rec.node_id, None)  # its key may speak for a new node id now
        for item in [i for i in self.items.values() if rec.node_id in i.nodes]:
            self.set_nodes(item, tuple(n for n in item.nodes if n != rec.node_id))

    def _apply_delete_items(self, rec: DeleteItems) -> None:
        for item_id in rec.ids:
            item = self.items.get(item_id)
            if item is not None:
                self.forget(item)

    def _apply_delete_queue(self, rec: DeleteQueue) -> None:
        """Every item still in the queue goes, then the queue with its settings."""
        for item in [i for i in self.items.values() if i.queue == rec.queue]:
            self.forget(item)
        self.queues.pop(rec.queue, None)
        self.uniques.drop_queue(rec.queue)


    # -- helpers ---------------------------------------------------------------------------

    def queue(self, name: str) -> QueueState:
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = QueueState(name)
        return q

    def config(self, name: str) -> QueueConfig:
        q = self.queues.get(name)
        return q.config if q is not None else QueueConfig()

    def replica_set(self, nodes: Iterable[str]) -> tuple[str, ...]:
        """One shared tuple per distinct replica set, not one per commit or per item."""
        nodes = tuple(nodes)
        return self._replica_sets.setdefault(nodes, nodes)

    def lease_of(self, item_id: int) -> int | None:
        """The token an item is leased under, or None if it is not leased."""
        held = self.held.get(item_id)
        return held[0] if held is not None else None

    def _enter(self, q: QueueState, item: Item, not_before: float) -> None:
        """Put a new record in line: ready now, or (status DELAYED) until ``not_before``."""
        self.items[item.id] = item
        q.index(item)
        if item.status == DELAYED:
            self.delays[item.id] = not_before
            q.n_delayed += 1
            heapq.heappush(q.delayed, (not_before, item))
        else:
            q.n_ready += 1
            q.ready.push(item)

    def _place(self, q: QueueState, item: Item, not_before: float, **changes: Any) -> None:
        """Put an item back in line (a new record, so its old heap entries go stale)."""
        status = DELAYED if not_before > 0 else READY
        self._enter(q, item._replace(status=status, **changes), not_before)

    def set_nodes(self, item: Item, nodes: tuple[str, ...]) -> None:
        """A new record with other replicas; a waiting item is pushed again under it."""
        new = item._replace(nodes=self.replica_set(nodes))
        self.items[item.id] = new
        q = self.queues[item.queue]
        if new.status == READY:
            q.ready.push(new)
        elif new.status == DELAYED:
            heapq.heappush(q.delayed, (self.delays[item.id], new))

    def _leave(self, q: QueueState, item: Item) -> None:
        """Take the item out of whatever counter its status puts it in.

        The caller stores a new record or forgets the item, which makes its heap entries stale.
        """
        if item.status == READY:
            q.n_ready -= 1
        elif item.status == DELAYED:
            q.n_delayed -= 1
            del self.delays[item.id]
        else:
            q.n_leased -= 1
            del self.held[item.id]
            if item.key:
                q.active.discard(item.key)

    def forget(self, item: Item) -> None:
        q = self.queues[item.queue]
        self._leave(q, item)
        q.unindex(item)
        del self.items[item.id]
        self.origins.pop(item.id, None)
        self.errors.pop(item.id, None)
        if self.ttrs:
            self.ttrs.pop(item.id, None)
        if self.lapsed:
            self.lapsed.pop(item.id, None)
        jobs = self.jobs
        if jobs.cancels or jobs.progress:
            jobs.drop(item.id)
        if jobs.result_jobs:
            jobs.unlink(item.id)
        if jobs.watched:
            jobs.touch(item.id)
        if jobs.waiting:
            jobs.unwait(item.id)
        if self.schedules.by_item and item.id in self.schedules.by_item:
            self.schedules.drop(self.schedules.by_item[item.id])  # its item deleted: it ends
        if jobs.dependents and item.id in jobs.dependents:  # gone unfinished: cancelled, deleted
            if (item.id, True) not in self._ended:
                self._ended.append((item.id, False))

    # -- pure queries (time is passed in) ----------------------------------------------------

    def waiting_with_key(self, queue: str, key: str) -> list[Item]:
        """Items of ``queue`` with ``key`` that are not leased (what coalescing replaces)."""
        q = self.queues.get(queue)
        if q is None:
            return []
        items = self.items
        return [items[i] for i in sorted(q.keyed.get(key, ())) if items[i].status != LEASED]

    def promote_due(self, q: QueueState, now: float) -> None:
        """Move delayed items whose time has come into the ready line."""
        items = self.items
        while q.delayed:
            not_before, item = q.delayed[0]
            if items.get(item.id) is not item:
                heapq.heappop(q.delayed)
                continue
            if not_before > now:
                break
            heapq.heappop(q.delayed)
            q.n_delayed -= 1
            del self.delays[item.id]
            items[item.id] = item = item.with_status(READY)
            q.n_ready += 1
            q.ready.push(item)

    def head(self, name: str, n: int, now: float, new: int | None = None) -> list[int]:
        """The ids a lease of ``n`` would take right now, in serving order; ``new``: at most
        that many never delivered (a rate-limited lease's tokens). See
        ``master/state/picking.py``."""
        return picking.head(self, name, n, now, new)

    def expired(self, now: float, limit: int = 10_000) -> list[int]:
        """Ids whose lease deadline has passed (at most ``limit``), by deadline, then id."""
        return self.expiries.due(now, self.held, limit)

    def leased_by(self, request: str) -> list[int]:
        """Items a lease call with this request id obtained and still holds (for retries)."""
        ids, leases = self.recent_leases.get(request, ((), ()))
        return [item_id for item_id, lease in zip(ids, leases, strict=True)
                if self.lease_of(item_id) == lease]

    # -- checkpoints (the layout is master.state.checkpoint_layout's) ------------------------------

    def export_parts(self) -> Iterator[Any]:
        """Everything durable as plain data (msgpack-able), for a checkpoint: a header of named
        values, then one row per item, so neither writing nor reading needs it all at once."""
        yield {"version": schema.VERSION, "id_hi": self.id_hi, "lease_seq": self.lease_seq,
               "node_addrs": self.node_addrs, "node_keys": self.node_keys,
               "cluster_id": self.cluster_id,
               "epoch": self.epoch, "standby": list(self.standby),
               "recent_leases": [[k, list(ids), list(leases)]
                                 for k, (ids, leases) in self.recent_leases.items()],
               "recent_commits": list(self.recent_commits),
               "queues": [{"name": q.name, **asdict(q.config)} for q in self.queues.values()],
               "recent_acks": list(self.recent_acks.items()), "items": len(self.items),
               "uniques": self.uniques.export(), "jobs": self.jobs.export(),
               "schedules": self.schedules.export(),
               "item_fields": list(schema.ITEM_FIELDS)}
        for item in self.items.values():
            yield self._row(item)

    def _row(self, item: Item) -> list[Any]:
        """An item's checkpoint row, in ``ITEM_FIELDS`` order."""
        lease, deadline = self.held.get(item.id, (0, 0.0))
        return [item.id, item.queue, item.size, item.crc, item.priority, item.order, item.key,
                list(item.nodes), item.attempts, item.enqueued_at, item.status, lease, deadline,
                self.delays.get(item.id, 0.0), self.origins.get(item.id, ""),
                self.errors.get(item.id, ""), self.ttrs.get(item.id, 0.0)]

    @classmethod
    def restore(cls, parts: Iterable[Any]) -> State:
        """Rebuild a state from ``export_parts()`` (or an older checkpoint's parts); lines and
        heaps are rebuilt in one pass each."""
        s = cls()
        parts = iter(parts)
        head = schema.read_header(next(parts))
        s.id_hi, s.lease_seq, s.node_addrs = head["id_hi"], head["lease_seq"], head["node_addrs"]
        s.cluster_id = head.get("cluster_id", "")  # none in checkpoints older than cluster ids
        s.node_keys = head.get("node_keys", {})  # none before data nodes had keys of their own
        s.epoch, s.standby = head.get("epoch", 0), tuple(head.get("standby", ("", "")))
        s.recent_acks = OrderedDict((i, lease) for i, lease in head["recent_acks"])
        s.recent_leases = OrderedDict((k, (ids, leases))
                                      for k, ids, leases in head["recent_leases"])
        s.recent_commits = OrderedDict.fromkeys(head["recent_commits"])
        s.uniques = Uniques.restore(head.get("uniques", ()))  # none before unique keys
        s.jobs = JobBook.restore(head.get("jobs"))  # none before jobs had results
        s.schedules = ScheduleBook.restore(head.get("schedules"))  # none before schedules
        names = QueueConfig.option_names()
        for settings in head["queues"]:
            s.queue(settings["name"]).config = QueueConfig(
                **{name: settings[name] for name in names if name in settings})
        read_row = schema.row_reader(head["item_fields"])
        ready: dict[str, list[Item]] = {}
        leased: dict[float, list[tuple[int, int]]] = {}  # deadline -> (id, lease) pairs
        for row in map(read_row, parts):
            (item_id, queue, size, crc, priority, order, key, nodes, attempts, enqueued_at,
             status, lease, deadline, not_before, origin, error, ttr) = row
            q = s.queue(queue)
            item = Item(priority, order, item_id, q.name, size, crc, key, s.replica_set(nodes),
                        enqueued_at, attempts, status)
            s.items[item_id] = item
            q.index(item)
            if origin:
                s.origins[item_id] = origin
            if error:
                s.errors[item_id] = error
            if ttr:
                s.ttrs[item_id] = ttr
            if status == READY:
                q.n_ready += 1
                ready.setdefault(q.name, []).append(item)
            elif status == DELAYED:
                q.n_delayed += 1
                s.delays[item_id] = not_before
                q.delayed.append((not_before, item))
            else:
                q.n_leased += 1
                if key:
                    q.active.add(key)
                s.held[item_id] = (lease, deadline)
                leased.setdefault(deadline, []).append((item_id, lease))
        for q in s.queues.values():
            q.ready = ReadyLine(ready.get(q.name, ()))
            heapq.heapify(q.delayed)
        for deadline, pairs in leased.items():  # one expiry entry per deadline
            s.expiries.add(deadline, *map(list, zip(*pairs, strict=True)))
        if len(s.items) != head["items"]:
            raise ValueError(f"checkpoint holds {len(s.items)} items, its header says "
                             f"{head['items']}")
        return s

    def snapshot(self) -> tuple[Any, ...]:
        """A comparable picture of the durable state (tests compare live and replayed)."""
        return (self.cluster_id, self.epoch, self.standby, self.id_hi, self.lease_seq,
                sorted(self.node_addrs.items()), sorted(self.node_keys.items()),
                list(self.recent_leases.items()), list(self.recent_commits),
                list(self.recent_acks.items()), sorted(self.uniques.export()),
                self.jobs.snapshot(), sorted(self.schedules.export()),
                sorted(self._row(i) for i in self.items.values()),
                sorted((q.name, q.config, q.n_ready, q.n_delayed, q.n_leased, sorted(q.active),
                        sorted((k, sorted(v)) for k, v in q.keyed.items()))
                       for q in self.queues.values()))


# record type -> how it changes the state (a function of the state and the record); outside
# the class, so that mypyc can compile it (bench/compiled.py)
_APPLY: dict[type, Callable[[State, Any], None]] = {
    Reserve: State._apply_reserve, CommitItems: State._apply_commit,
    LeaseItems: State._apply_lease, AckItems: State._apply_ack,
    ReleaseItems: State._apply_release, BuryItems: State._apply_release,
    RedriveItems: State._apply_redrive, ConfigureQueue: State._apply_configure,
    WakeItems: State._apply_wake, ExpireUniques: State._apply_expire_uniques,
    # the job features' records (master/state/job_records.py)
    CancelItems: job_records.apply_cancel, ProgressItems: job_records.apply_progress,
    ForgetResults: job_records.apply_forget_results,
    AddSchedule: job_records.apply_add_schedule,
    DropSchedule: job_records.apply_drop_schedule, RearmItems: job_records.apply_rearm,
    NodeSeen: State._apply_node_seen, AddReplicas: State._apply_add_replicas,
    NodeKeyBound: State._apply_node_key_bound, DropReplicas: State._apply_drop_replicas,
    RebuildItems: State._apply_rebuild_items,
    ClusterCreated: State._apply_cluster_created, EpochBegun: State._apply_epoch_begun,
    StandbySynced: State._apply_standby_synced, ForgetNode: State._apply_forget_node,
    DeleteItems: State._apply_delete_items, DeleteQueue: State._apply_delete_queue,
}
