"""Queue administration and cluster status: stats, configure, purge, peek, redrive, status."""

from __future__ import annotations

import bisect
import dataclasses
import heapq
from collections.abc import Callable
from typing import Any

from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument, QueueExists
from blizzard.wire.queue_settings import NAMES
from master.config import MasterConfig
from master.consume.leases import Leases
from master.nodes.blob_deletes import Deletes
from master.nodes.membership import Membership
from master.nodes.repair import Repairer
from master.nodes.safe_mode import SafeMode
from master.produce.enqueue import Enqueues
from master.rules import arguments
from master.rules.queue_policy import QueuePolicy
from master.state.item import DELAYED, LEASED
from master.state.machine import State
from master.state.records import ConfigureQueue, DeleteItems, RedriveItems, WakeItems


class QueueAdmin:
    """Requests operators send: queue settings and counts, purge, peek, redrive, cluster status."""

    def __init__(self, config: MasterConfig, state: State, log_record: Callable[[Any], None],
                 deletes: Deletes, enqueues: Enqueues, leases: Leases, membership: Membership,
                 repair: Repairer, safe_mode: SafeMode, policy: QueuePolicy | None = None) -> None:
        self.config = config
        self.policy = policy if policy is not None else QueuePolicy(config, state, lambda _: None)
        self.state = state
        self.log = log_record
        self.deletes = deletes
        self.enqueues = enqueues
        self.leases = leases
        self.membership = membership
        self.repair = repair
        self.safe_mode = safe_mode

    def queue_stats(self, name: str, now: float) -> p.QueueStats:
        q = self.state.queues.get(name)
        config = self.state.config(name)
        settings = p.QueueSettings(**config.as_dict())
        pending = self.enqueues.count(name)
        dead_q = self.state.queues.get(config.dead_letter_queue(name))
        counts = self.leases.counts
        enqueued, acked = counts.get("enqueued", name), counts.get("acked", name)
        dead = dead_q.n_ready + dead_q.n_delayed + dead_q.n_leased if dead_q is not None else 0
        if q is None:
            return p.QueueStats(name, 0, 0, 0, pending, dead, 0.0, enqueued, acked, settings,
                                exists=False)
        top = self._first_ready(q, now)
        oldest = max(0.0, now - top.enqueued_at) if top is not None else 0.0
        return p.QueueStats(name, q.n_ready, q.n_delayed, q.n_leased, pending, dead, oldest,
                            enqueued, acked, settings)

    def _first_ready(self, q: Any, now: float) -> Any:
        """The ready item served next, key exclusion aside (its age is the queue's age).

        Stale entries (leased or acked since they were pushed) are dropped off the front
        for good, as ``State.head`` drops them; unlike ``head`` this never walks past a live
        item, so a large backlog behind one leased key costs nothing here.
        """
        self.state.promote_due(q, now)
        return q.ready.first_live(self.state.items)

    def stats(self, msg: p.Stats, now: float, *_: Any) -> p.QueueStats:
        return self.queue_stats(arguments.queue_name(msg.queue), now)

    def list_queues(self, msg: p.ListQueues, now: float, *_: Any) -> p.QueueList:
        """One page of queues by name: a listing of every queue might not fit a reply."""
        if msg.limit < 0:
            raise InvalidArgument("limit must be 0 (a whole page) or positive")
        if msg.after:
            arguments.queue_name(msg.after, "after")
        limit = min(msg.limit or p.MAX_QUEUE_PAGE, p.MAX_QUEUE_PAGE)
        names = sorted(self.state.queues)
        start = bisect.bisect_right(names, msg.after) if msg.after else 0
        page = names[start:start + limit]
        return p.QueueList([self.queue_stats(name, now) for name in page],
                           len(names) - start - len(page))

    def configure(self, msg: p.Configure, now: float, mono: float = 0.0,
                  peer: bytes = b"", *_: Any) -> p.QueueStats:
        arguments.queue_name(msg.queue)
        if msg.create and msg.queue in self.state.queues:
            raise QueueExists(f"queue {msg.queue!r} exists; change its settings with "
                              f"`blizzard queue config {msg.queue} --OPTION VALUE` "
                              "(Client.configure_queue)")
        self.policy.may_create(msg.queue, peer)
        current = self.state.config(msg.queue)
        changes = {name: getattr(msg, name) for name in NAMES if getattr(msg, name) is not None}
        self.policy.may_set(changes, peer)  # a client's create (only an admin changes a queue)
        new = dataclasses.replace(current, **changes).validate()
        if new.dead_letter:
            arguments.queue_name(new.dead_letter, "queue option dead_letter")
        if new != current or msg.queue not in self.state.queues:
            self.log(ConfigureQueue(msg.queue, **new.as_dict()))
            self.leases.buckets.pop(msg.queue, None)
        return self.queue_stats(msg.queue, now)

    def purge(self, msg: p.Purge, now: float, *_: Any) -> p.Acked:
        arguments.queue_name(msg.queue)
        scheduled = self.state.schedules.by_item  # a schedule's call stays: remove it instead
        waiting = [i.id for i in self.state.items.values()
                   if i.queue == msg.queue and i.status != LEASED and i.id not in scheduled]
        for start in range(0, len(waiting), p.MAX_BATCH):
            part = waiting[start:start + p.MAX_BATCH]
            holders = [self.state.items[i].nodes for i in part]
            self.log(DeleteItems(ids=part))  # gone, not done: what waits on them fails
            for item_id, nodes in zip(part, holders, strict=True):
                self.deletes.drop_blobs(item_id, nodes)
        return p.Acked(done=len(waiting), lost=[])

    def peek(self, msg: p.Peek, now: float, *_: Any) -> p.Leased:
        arguments.queue_name(msg.queue)
        arguments.batch(msg.n)
        if msg.ids:
            arguments.batch(len(msg.ids))
        state = self.state
        if msg.ids:  # these, where they are in the queue (a leased one's token not told)
            items = state.items
            ids = [i for i in dict.fromkeys(msg.ids) if i in items
                   and items[i].queue == msg.queue][:msg.n]
            seen = self.leases.describe(msg.queue, ids, [], now)
            return p.replace(seen, leases=[0] * len(ids))
        elif msg.delayed:  # the delayed ones due first
            q = state.queues.get(msg.queue)
            if q is not None:
                state.promote_due(q, now)
            live = ((at, item.id) for at, item in (q.delayed if q is not None else ())
                    if state.items.get(item.id) is item)  # the heap holds stale entries too
            ids = [i for _, i in heapq.nsmallest(msg.n, live)]
        else:
            ids = state.head(msg.queue, msg.n, now)
        return self.leases.describe(msg.queue, ids, [], now)

    def redrive(self, msg: p.Redrive, now: float, *_: Any) -> p.Acked:
        arguments.queue_name(msg.queue)
        arguments.batch(msg.n)
        if msg.ids:
            arguments.batch(len(msg.ids))
        dead_q = self.state.config(msg.queue).dead_letter_queue(msg.queue)
        items, origins = self.state.items, self.state.origins

        def dead_of_queue(item_id: int) -> bool:
            item = items[item_id]
            return item.status != LEASED and (item.queue == msg.queue or (
                item.queue == dead_q and origins[item_id] == msg.queue))

        if msg.ids:  # these only: dead ones go home, delayed ones of the queue are woken
            wanted = [i for i in dict.fromkeys(msg.ids) if i in items][:msg.n]
            ids = [i for i in wanted if i in origins and dead_of_queue(i)]
            held = self.state.jobs.waiting, self.state.schedules.by_item  # not these
            woken = [i for i in wanted if i not in origins and items[i].queue == msg.queue
                     and items[i].status == DELAYED and i not in held[0] and i not in held[1]]
            if woken:
                self.log(WakeItems(ids=woken))
        else:
            ids, woken = sorted(i for i in origins if dead_of_queue(i))[:msg.n], []
        if ids:
            self.log(RedriveItems(ids=ids))
        return p.Acked(done=len(ids) + len(woken), lost=[])

    def status(self, msg: p.Status, now: float, mono: float, *_: Any) -> p.ClusterStatus:
        members = self.membership
        nodes = [p.NodeStatus(n.node_id, n.addr, members.is_alive(n, mono),
                              mono - n.last_seen, n.items, n.bytes_used, n.free_bytes,
                              members.is_alive(n, mono) and members.is_suspect(n, mono))
                 for n in sorted(members.nodes.values(), key=lambda n: n.node_id)]
        names = sorted(self.state.queues)
        queues = [self.queue_stats(name, now) for name in names[:p.MAX_QUEUE_PAGE]]
        under = self.repair.under_replicated(mono)
        return p.ClusterStatus(nodes, queues, under, self.config.replication,
                               self.config.keys is not None, self.safe_mode.on,
                               self.state.cluster_id, self.state.epoch,
                               self.state.standby[1] if self.config.sync_standby else "",
                               max(0, len(names) - p.MAX_QUEUE_PAGE))
