"""Pending enqueues: alloc (ids and a placement), commit (make items visible), expiry.

An enqueue is alloc -> put on the data nodes -> commit. Between alloc and commit the items
are pending: in memory only (a restart forgets them; the client's retry stages them again).
A handler validates fully before it logs anything, and logs before it changes anything in
memory, so a refused request changes nothing.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any, Callable

from blizzard import protocol as p
from blizzard.errors import (InvalidArgument, MasterStarting, NotEnoughDatanodes, PayloadTooLarge,
                             TooManyItems, UnknownItem)
from master import checks
from master.config import MasterConfig
from master.deletes import Deletes
from master.ids import ItemIds
from master.membership import Membership
from master.records import CommitItems
from master.safe_mode import SafeMode
from master.state import State

MAX_DELAY_S = 365 * 86400.0
MAX_KEY = 256
MAX_PENDING = 1_000_000  # items allocated and not committed, all clients together
MAX_PENDING_PER_PEER = 200_000  # ... one connection's share


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
    peer: bytes  # the connection that allocated them (its share of the cap)


class Enqueues:
    """Alloc and commit requests, the pending items between them, and their expiry."""

    def __init__(self, config: MasterConfig, state: State, log: Callable[[Any], None],
                 ids: ItemIds, membership: Membership, safe_mode: SafeMode,
                 deletes: Deletes) -> None:
        self.config = config
        self.state = state
        self.log = log
        self.ids = ids
        self.membership = membership
        self.safe_mode = safe_mode
        self.deletes = deletes
        self.pending: dict[int, Pending] = {}
        self.expiry: list[tuple[float, int, int, Pending]] = []  # (when, first, n, batch)
        self.by_queue: dict[str, int] = {}  # pending items per queue (for stats, no scan)
        self.by_peer: dict[bytes, int] = {}

    def count(self, queue: str) -> int:
        return self.by_queue.get(queue, 0)

    # -- alloc -------------------------------------------------------------------------------

    def alloc(self, msg: p.Alloc, now: float, mono: float, peer: bytes, rid: int) -> p.Placement:
        checks.queue_name(msg.queue)
        checks.new_queue_allowed(self.state, msg.queue)
        n = checks.same_length(sizes=msg.sizes, crcs=msg.crcs, priorities=msg.priorities,
                               delays=msg.delays, keys=msg.keys)
        checks.batch(n)
        checks.node_ids(msg.exclude, "exclude")
        self._check_items(msg)
        if msg.coalesce and not all(msg.keys):
            raise InvalidArgument("coalescing needs a key on every item")
        if len(self.pending) + n > MAX_PENDING:
            raise TooManyItems(f"{len(self.pending)} items are allocated and not committed; the "
                               f"master holds at most {MAX_PENDING} (commit or retry later)")
        if self.by_peer.get(peer, 0) + n > MAX_PENDING_PER_PEER:
            raise TooManyItems(f"this connection has {self.by_peer[peer]} items allocated and "
                               f"not committed; at most {MAX_PENDING_PER_PEER}")
        nodes = self.membership.place(self.config.replication, set(msg.exclude), mono)
        if len(nodes) < self.config.write_quorum and self.safe_mode.on:
            raise MasterStarting("the master is starting and waits for data nodes to report")
        if len(nodes) < self.config.write_quorum:
            raise NotEnoughDatanodes(f"{len(nodes)} live data nodes can take the write; "
                                     f"{self.config.write_quorum} needed")
        first = self.ids.take(n)
        not_befores = [now + d if d else 0.0 for d in msg.delays] if any(msg.delays) else msg.delays
        batch = Pending(msg.queue, first, msg.sizes, msg.crcs, msg.priorities, not_befores,
                        msg.keys, msg.coalesce, tuple(node.node_id for node in nodes), n, peer)
        ids = range(first, first + n)
        self.pending.update(dict.fromkeys(ids, batch))
        self.by_queue[msg.queue] = self.by_queue.get(msg.queue, 0) + n
        self.by_peer[peer] = self.by_peer.get(peer, 0) + n
        heapq.heappush(self.expiry, (mono + self.config.pending_timeout_s, first, n, batch))
        return p.Placement(list(ids), [p.NodeRef(node.node_id, node.addr) for node in nodes],
                           self.config.write_quorum, self.config.pending_timeout_s)

    def _check_items(self, msg: p.Alloc) -> None:
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

    # -- commit ------------------------------------------------------------------------------

    def commit(self, msg: p.Commit, now: float, *_: Any) -> p.Committed:
        checks.batch(len(msg.ids))
        checks.request_id(msg.request)
        checks.node_ids(msg.stored_on, "stored_on")
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
                # only nodes the placement named count: a node's word for another is no proof
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
            keys = columns[4]
            replaced = [old for key in (set(keys) if coalesce else ()) if key
                        for old in self.state.waiting_with_key(queue, key)]
            self.log(CommitItems(
                queue=queue, ids=ids, sizes=columns[0], crcs=columns[1], priorities=columns[2],
                not_befores=columns[3], keys=keys, coalesce=coalesce, nodes=list(nodes), at=now,
                request=msg.request))
            for batch, item_id in members:  # only now, with the record logged
                self._settle(pending.pop(item_id), 1)
            # coalescing dropped older waiting items (and all but the last of a burst)
            gone = [(old.id, old.nodes) for old in replaced]
            gone += [(i, nodes) for i in ids if i not in items]
            for item_id, holders in gone:
                self.deletes.drop_blobs(item_id, holders)
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

    def _settle(self, batch: Pending, n: int) -> None:
        """``n`` of a batch's items left the pending table (committed or expired)."""
        batch.left -= n
        if not batch.left:  # its expiry entry lingers until the deadline; its columns need not
            batch.sizes = batch.crcs = batch.priorities = batch.not_befores = batch.keys = []
        left = self.by_queue[batch.queue] - n
        if left:
            self.by_queue[batch.queue] = left
        else:
            del self.by_queue[batch.queue]
        left = self.by_peer[batch.peer] - n
        if left:
            self.by_peer[batch.peer] = left
        else:
            del self.by_peer[batch.peer]

    # -- expiry ------------------------------------------------------------------------------

    def expire(self, mono: float) -> None:
        """Drop allocs not committed in time; their blobs (if any were put) are deleted."""
        while self.expiry and self.expiry[0][0] <= mono:
            _, first, n, batch = heapq.heappop(self.expiry)
            if not batch.left:
                continue
            for item_id in range(first, first + n):
                if self.pending.get(item_id) is batch:
                    del self.pending[item_id]
                    self._settle(batch, 1)
                    self.deletes.drop_blobs(item_id, batch.nodes)
