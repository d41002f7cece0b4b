"""The master's queue requests: enqueue (alloc, commit), leases, settling, queue admin.

A handler validates fully before it logs anything, so a refused request changes nothing.
Handlers run inside ``MasterServer.run_once``; records they log are fsynced before any reply.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from blizzard import protocol as p
from blizzard.errors import (InvalidArgument, MasterStarting, NotEnoughDatanodes, PayloadTooLarge,
                             QueueExists, UnknownItem)
from master import checks
from master.queues import QueueConfig, TokenBucket
from master.records import (AckItems, CommitItems, ConfigureQueue, LeaseItems, RedriveItems,
                            ReleaseItems, Reserve)
from master.state import LEASED

if TYPE_CHECKING:
    from master.server import MasterServer

MAX_WAIT_S = 300.0
MAX_DELAY_S = 365 * 86400.0
MAX_KEY = 256


@dataclass(slots=True)
class Pending:
    """One alloc's items, allocated and not yet committed (memory only: a restart forgets them).

    Item ``i`` of the alloc has id ``first + i``; each id maps to this object until committed.
    """

    queue: str
    first: int
    sizes: list[int]
    crcs: list[int]
    priorities: list[int]
    not_befores: list[float]
    keys: list[str]
    coalesce: bool
    nodes: tuple[str, ...]
    left: int  # items not committed yet


@dataclass(slots=True)
class Waiter:
    """A long-polling lease request parked until items (and rate tokens) are there, or time is up."""

    peer: bytes
    rid: int
    msg: p.Lease
    until: float  # monotonic


class QueueHandlers:
    """Mixed into MasterServer: every queue-facing request."""

    # -- enqueue -----------------------------------------------------------------------------

    def _alloc(self: "MasterServer", msg: p.Alloc, now: float, mono: float, *_: Any) -> p.Placement:
        checks.queue_name(msg.queue)
        n = checks.same_length(sizes=msg.sizes, crcs=msg.crcs, priorities=msg.priorities,
                               delays=msg.delays, keys=msg.keys)
        checks.batch(n)
        self._check_items(msg)
        if msg.coalesce and not all(msg.keys):
            raise InvalidArgument("coalescing needs a key on every item")
        nodes = self.membership.place(self.config.replication, set(msg.exclude), mono)
        if len(nodes) < self.config.write_quorum and self.safe_until:
            raise MasterStarting("the master is starting and waits for data nodes to report")
        if len(nodes) < self.config.write_quorum:
            raise NotEnoughDatanodes(f"{len(nodes)} live data nodes can take the write; "
                                     f"{self.config.write_quorum} needed")
        first = self.next_id
        self.next_id += n
        if self.next_id > self.state.id_hi:
            self.log_record(Reserve(id_hi=self.next_id + self.config.id_block))
        ids = list(range(first, first + n))
        not_befores = [now + d if d else 0.0 for d in msg.delays] if any(msg.delays) else msg.delays
        batch = Pending(msg.queue, first, msg.sizes, msg.crcs, msg.priorities, not_befores,
                        msg.keys, msg.coalesce, tuple(node.node_id for node in nodes), n)
        self.pending.update(dict.fromkeys(ids, batch))
        heapq.heappush(self.pending_expiry, (mono + self.config.pending_timeout_s, ids))
        return p.Placement(ids=ids, nodes=[p.NodeRef(n.node_id, n.addr) for n in nodes],
                           min_copies=self.config.write_quorum,
                           deadline_s=self.config.pending_timeout_s)

    def _check_items(self: "MasterServer", msg: p.Alloc) -> None:
        """Every item's size, checksum, priority, delay and key, whole columns at a time.

        The column test runs in C; only when it finds something is each item looked at, to
        name the offender.
        """
        low, high = checks.PRIORITY_RANGE
        if (min(msg.sizes) >= 0 and max(msg.sizes) <= self.config.max_item_bytes
                and min(msg.crcs) >= 0 and max(msg.crcs) < 2**32
                and min(msg.priorities) >= low and max(msg.priorities) <= high
                and math.isfinite(sum(msg.delays)) and min(msg.delays) >= 0
                and max(msg.delays) <= MAX_DELAY_S and max(map(len, msg.keys)) <= MAX_KEY):
            return
        for size in msg.sizes:
            if not 0 <= size <= self.config.max_item_bytes:
                raise PayloadTooLarge(f"an item of {size} bytes exceeds max-item-bytes "
                                      f"{self.config.max_item_bytes}")
        for crc, prio, delay, key in zip(msg.crcs, msg.priorities, msg.delays, msg.keys):
            checks.checksum(crc)
            checks.priority(prio)
            checks.seconds(delay, "delay_s", low=0, high=MAX_DELAY_S)
            if len(key) > MAX_KEY:
                raise InvalidArgument(f"a key is at most {MAX_KEY} characters")

    def _commit(self: "MasterServer", msg: p.Commit, now: float, *_: Any) -> p.Committed:
        checks.batch(len(msg.ids))
        if len(set(msg.ids)) != len(msg.ids):
            raise InvalidArgument("a commit lists an id more than once")
        if msg.request and msg.request in self.state.recent_commits:
            return p.Committed(count=len(msg.ids))  # a retry of a commit that landed
        stored = set(msg.stored_on)
        pending, items = self.pending, self.state.items
        unknown = [i for i in msg.ids if i not in pending and i not in items]
        if unknown:
            raise UnknownItem(f"{len(unknown)} ids are not pending (expired or never allocated), "
                              f"e.g. {unknown[:5]}; the enqueue must be retried")
        # item ids grouped by what one CommitItems record shares: queue, replicas, coalescing
        groups: dict[tuple[str, tuple[str, ...], bool], list[tuple[Pending, int]]] = {}
        for item_id in msg.ids:
            batch = pending.get(item_id)
            if batch is None:
                continue  # committed before: a retry
            key = (batch.queue, batch.nodes, batch.coalesce)
            group = groups.get(key)
            if group is None:
                nodes = tuple(n for n in batch.nodes if n in stored)
                if len(nodes) < self.config.write_quorum:
                    raise NotEnoughDatanodes(f"item {item_id} is stored on {len(nodes)} of its "
                                             f"placed nodes; {self.config.write_quorum} needed")
                group = groups[key] = []
            group.append((batch, item_id))
        for (queue, placed, coalesce), members in groups.items():
            nodes = tuple(n for n in placed if n in stored)
            ids = [item_id for _, item_id in members]
            columns = self._columns(members, ids)
            for item_id in ids:
                pending.pop(item_id).left -= 1
            keys = columns[4]
            replaced = [old for key in (set(keys) if coalesce else ()) if key
                        for old in self.state.waiting_with_key(queue, key)]
            self.log_record(CommitItems(
                queue=queue, ids=ids, sizes=columns[0], crcs=columns[1], priorities=columns[2],
                not_befores=columns[3], keys=keys, coalesce=coalesce, nodes=list(nodes), at=now,
                request=msg.request))
            # coalescing dropped older waiting items (and all but the last of a burst)
            gone = [(old.id, old.nodes) for old in replaced]
            gone += [(i, nodes) for i in ids if i not in items]
            for item_id, holders in gone:
                self.drop_blobs(item_id, holders)
        return p.Committed(count=len(msg.ids))

    @staticmethod
    def _columns(members: list[tuple[Pending, int]],
                 ids: list[int]) -> tuple[list, list, list, list, list]:
        """Sizes, checksums, priorities, not-befores and keys of pending items, in order.

        The usual commit is one whole alloc, in order: its columns are taken as they are.
        """
        batch = members[0][0]
        n = len(batch.sizes)
        if batch.left == n == len(ids) and ids == list(range(batch.first, batch.first + n)):
            return batch.sizes, batch.crcs, batch.priorities, batch.not_befores, batch.keys
        at = [(b, item_id - b.first) for b, item_id in members]
        return ([b.sizes[k] for b, k in at], [b.crcs[k] for b, k in at],
                [b.priorities[k] for b, k in at], [b.not_befores[k] for b, k in at],
                [b.keys[k] for b, k in at])

    # -- leases ------------------------------------------------------------------------------

    def _lease_request(self: "MasterServer", msg: p.Lease, now: float, mono: float, peer: bytes,
                       rid: int) -> p.Leased | None:
        checks.queue_name(msg.queue)
        checks.batch(msg.n)
        checks.seconds(msg.lease_s, "lease_s", low=0, high=self.config.max_lease_s)
        checks.seconds(msg.wait_s, "wait_s", low=0, high=MAX_WAIT_S)
        lost: list[int] = []
        if msg.ack_ids:
            lost = self._ack(p.Ack(msg.ack_ids, msg.ack_leases)).lost
        if msg.request in self.state.recent_leases:  # a retry: the same items again
            return self._leased(msg.queue, self.state.leased_by(msg.request), lost)
        ids = self._lease(msg, now, mono)
        if ids or msg.wait_s == 0 or lost:  # lost acks are news the caller must get now
            return self._leased(msg.queue, ids, lost)
        self.waiters.append(Waiter(peer, rid, msg, mono + msg.wait_s))
        return None

    def _lease(self: "MasterServer", msg: p.Lease, now: float, mono: float) -> list[int]:
        config = self.state.config(msg.queue)
        allowed = msg.n
        if config.rate_per_s > 0:  # one bucket per queue: a global limit over all consumers
            bucket = self.buckets.get(msg.queue)
            if bucket is None:
                bucket = self.buckets[msg.queue] = TokenBucket(config.rate_per_s, config.burst)
            allowed = bucket.take(msg.n, mono)
        ids = self.state.head(msg.queue, allowed, now) if allowed else []
        if allowed > len(ids) and config.rate_per_s > 0:
            self.buckets[msg.queue].tokens += allowed - len(ids)  # unused grants go back
        if ids:
            first = self.state.lease_seq + 1
            lease_s = msg.lease_s or config.lease_s
            self.log_record(LeaseItems(ids=ids, leases=list(range(first, first + len(ids))),
                                       deadline=now + lease_s, request=msg.request))
        return ids

    def _leased(self: "MasterServer", queue: str, ids: list[int], lost: list[int]) -> p.Leased:
        """Describe items column by column; replica sets are shared between items."""
        items = [self.state.items[i] for i in ids]
        set_index: dict[tuple[str, ...], int] = {}
        replica_set = []
        for item in items:
            k = set_index.get(item.nodes)
            if k is None:
                k = set_index[item.nodes] = len(set_index)
            replica_set.append(k)
        leases = [i.lease if i.status == LEASED else 0 for i in items]
        return p.Leased(queue, ids, leases, [i.size for i in items], [i.crc for i in items],
                        [i.attempts for i in items], [i.priority for i in items],
                        [i.enqueued_at for i in items], [i.key for i in items], replica_set,
                        [p.ReplicaSet(self.node_refs(nodes)) for nodes in set_index], lost)

    def _settle(self: "MasterServer", ids: list[int],
                leases: list[int]) -> tuple[list[int], list[int], int]:
        """Split (id, lease) pairs into still-held leases, lost leases, and already-gone ids."""
        checks.batch(checks.same_length(ids=ids, leases=leases))
        held, lost, gone = [], [], 0
        acked = self.state.recent_acks
        for item_id, lease in zip(ids, leases):
            item = self.state.items.get(item_id)
            if item is None:
                if acked.get(item_id, lease) == lease:
                    gone += 1  # acked under this very lease: a retry
                else:
                    lost.append(item_id)  # another consumer's delivery was acked
            elif item.status == LEASED and item.lease == lease:
                held.append(item_id)
            else:
                lost.append(item_id)
        return held, lost, gone

    def _ack(self: "MasterServer", msg: p.Ack, *_: Any) -> p.Acked:
        held, lost, gone = self._settle(msg.ids, msg.leases)
        if held:
            for item_id in held:
                self.drop_blobs(item_id, self.state.items[item_id].nodes)
            self.log_record(AckItems(ids=held))
        return p.Acked(done=len(held) + gone, lost=lost)

    def _nack(self: "MasterServer", msg: p.Nack, now: float, *_: Any) -> p.Acked:
        if msg.delay_s is not None:
            checks.seconds(msg.delay_s, "delay_s", low=0, high=MAX_DELAY_S)
        held, lost, gone = self._settle(msg.ids, msg.leases)
        if held:
            self.release(held, now, msg.delay_s, msg.error[:2000])
        return p.Acked(done=len(held) + gone, lost=lost)

    def release(self: "MasterServer", ids: list[int], now: float, delay_s: float | None,
                error: str = "") -> None:
        """Give leased items back: after ``delay_s``, or (None) after their queue's back-off."""
        not_befores = []
        for item_id in ids:
            item = self.state.items[item_id]
            delay = delay_s if delay_s is not None else \
                self.state.config(item.queue).backoff_s(item.attempts + 1)
            not_befores.append(now + delay if delay > 0 else 0.0)
        self.log_record(ReleaseItems(ids=ids, not_befores=not_befores, error=error))

    def _extend(self: "MasterServer", msg: p.Extend, now: float, *_: Any) -> p.Acked:
        checks.seconds(msg.lease_s, "lease_s", low=0, high=self.config.max_lease_s, low_ok=False)
        held, lost, gone = self._settle(msg.ids, msg.leases)
        lost += [i for i in msg.ids if i not in self.state.items]  # gone: nothing to extend
        if held:
            self.log_record(LeaseItems(ids=held, leases=[self.state.items[i].lease for i in held],
                                       deadline=now + msg.lease_s, request=""))
        return p.Acked(done=len(held), lost=lost)

    # -- queue admin -------------------------------------------------------------------------

    def queue_stats(self: "MasterServer", name: str, now: float) -> p.QueueStats:
        q = self.state.queues.get(name)
        config = self.state.config(name)
        settings = p.QueueSettings(*[getattr(config, f.name) for f in fields(QueueConfig)])
        pending = sum(1 for x in self.pending.values() if x.queue == name) if self.pending else 0
        dead_q = self.state.queues.get(config.dead_letter_queue(name))
        dead = dead_q.n_ready + dead_q.n_delayed + dead_q.n_leased if dead_q is not None else 0
        if q is None:
            return p.QueueStats(name, 0, 0, 0, pending, dead, 0.0, settings)
        self.state.promote_due(q, now)
        oldest = 0.0
        for entry in q.ready[:1]:
            item = self.state.items.get(entry[2])
            if item is not None:
                oldest = max(0.0, now - item.enqueued_at)
        return p.QueueStats(name, q.n_ready, q.n_delayed, q.n_leased, pending, dead, oldest, settings)

    def _stats(self: "MasterServer", msg: p.Stats, now: float, *_: Any) -> p.QueueStats:
        return self.queue_stats(checks.queue_name(msg.queue), now)

    def _list_queues(self: "MasterServer", msg: p.ListQueues, now: float, *_: Any) -> p.QueueList:
        return p.QueueList([self.queue_stats(name, now) for name in sorted(self.state.queues)])

    def _configure(self: "MasterServer", msg: p.Configure, now: float, *_: Any) -> p.QueueStats:
        checks.queue_name(msg.queue)
        if msg.create and msg.queue in self.state.queues:
            raise QueueExists(f"queue {msg.queue!r} exists; change it with configure")
        current = self.state.config(msg.queue)
        changes = {f.name: getattr(msg, f.name) for f in fields(QueueConfig)
                   if getattr(msg, f.name) is not None}
        values = {f.name: getattr(current, f.name) for f in fields(QueueConfig)} | changes
        new = QueueConfig(**values).validate()
        if new.dead_letter:
            checks.queue_name(new.dead_letter)
        if new != current or msg.queue not in self.state.queues:
            self.log_record(ConfigureQueue(msg.queue, **values))
            self.buckets.pop(msg.queue, None)
        return self.queue_stats(msg.queue, now)

    def _purge(self: "MasterServer", msg: p.Purge, now: float, *_: Any) -> p.Acked:
        checks.queue_name(msg.queue)
        waiting = [i.id for i in self.state.items.values()
                   if i.queue == msg.queue and i.status != LEASED]
        for start in range(0, len(waiting), p.MAX_BATCH):
            part = waiting[start:start + p.MAX_BATCH]
            for item_id in part:
                self.drop_blobs(item_id, self.state.items[item_id].nodes)
            self.log_record(AckItems(ids=part))
        return p.Acked(done=len(waiting), lost=[])

    def _peek(self: "MasterServer", msg: p.Peek, now: float, *_: Any) -> p.Leased:
        checks.queue_name(msg.queue)
        checks.batch(msg.n)
        return self._leased(msg.queue, self.state.head(msg.queue, msg.n, now), [])

    def _redrive(self: "MasterServer", msg: p.Redrive, now: float, *_: Any) -> p.Acked:
        checks.queue_name(msg.queue)
        checks.batch(msg.n)
        dead_q = self.state.config(msg.queue).dead_letter_queue(msg.queue)
        ids = sorted(i.id for i in self.state.items.values()
                     if i.origin and i.status != LEASED
                     and (i.queue == msg.queue or (i.queue == dead_q and i.origin == msg.queue)))
        ids = ids[:msg.n]
        if ids:
            self.log_record(RedriveItems(ids=ids))
        return p.Acked(done=len(ids), lost=[])

    def drop_blobs(self: "MasterServer", item_id: int, nodes: tuple[str, ...]) -> None:
        """Tell each holder (in its next heartbeat reply) to delete the item's blob."""
        for node in nodes:
            self.deletes.setdefault(node, []).append(item_id)

    def node_refs(self: "MasterServer", node_ids: tuple[str, ...]) -> list[p.NodeRef]:
        """Replica addresses, live nodes first."""
        mono = time.monotonic()
        refs = []
        for node_id in node_ids:
            node = self.membership.nodes.get(node_id)
            alive = node is not None and self.membership.is_alive(node, mono)
            addr = node.addr if node is not None else self.state.node_addrs.get(node_id, "")
            refs.append((not alive, p.NodeRef(node_id, addr)))
        refs.sort(key=lambda r: r[0])
        return [r for _, r in refs]

    QUEUE_HANDLERS = {
        p.Alloc: _alloc,
        p.Commit: _commit,
        p.Lease: _lease_request,
        p.Ack: _ack,
        p.Nack: _nack,
        p.Extend: _extend,
        p.Stats: _stats,
        p.ListQueues: _list_queues,
        p.Configure: _configure,
        p.Purge: _purge,
        p.Peek: _peek,
        p.Redrive: _redrive,
    }
