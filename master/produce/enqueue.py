"""Enqueues: items become visible once their payloads are durable on enough data nodes.

A producer holds ids from a ``Place`` (``Blocks``), sends each payload to every placed node
and its ``Enqueue`` to the master at once. The enqueue waits (parked, like a long poll) until
W (``min_replicas``) placed nodes have reported every id stored, then its items are logged and the
reply goes out after the pass's fsync (P1). An ``Enqueue`` with ``hold`` keeps its items
pending instead, in memory only, until a ``Commit`` (``Client.stage``/``commit``); a restart
forgets them and the producer stages them again.

A write never waits on one node: an enqueue still short of reports a hedge delay after its
first node reported (``blizzard/net/hedge.py``; the delay from how far each node's reports
lagged the first of recent enqueues, at least ``WRITE_FLOOR_S``) is answered ``PutAlso``,
naming healthy nodes that join the placement; the client, which still holds the payloads,
puts them there too and sends the enqueue again. Reports already in still count, and
"committed" still means W fsynced copies (P1). A late copy on the slow node is a stray once
the item is committed elsewhere, and is deleted when reported (``Blocks.report``). Timing
from the first report, not from the enqueue, leaves a client that sends its puts late no way
to teach the master long delays; an enqueue not yet hedgeable is looked at again later.

A handler validates fully before it logs anything, and logs before it changes anything in
memory, so a refused request changes nothing.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from blizzard.net.hedge import HedgeDelays
from blizzard.server.router import error_reply
from blizzard.wire import protocol as p
from blizzard.wire.codec import as_ids
from blizzard.wire.errors import (
    BlizzardError,
    Forbidden,
    InvalidArgument,
    NotEnoughDatanodes,
    PayloadTooLarge,
    TooManyItems,
    UnknownItem,
    UnknownQueue,
)
from blizzard.wire.limits import MAX_DELAY_S, MAX_KEY, MAX_UNIQUE_S, MIN_LEASE_S, PRIORITY_RANGE
from master.config import MasterConfig
from master.nodes.blob_deletes import Deletes
from master.produce.job_checks import check_dependencies, check_results
from master.produce.placements import Blocks
from master.rules import arguments
from master.rules.queue_policy import QueuePolicy
from master.state.counts import QueueCounts
from master.state.machine import State
from master.state.records import CommitItems, ExpireUniques

MAX_PENDING = 1_000_000  # items staged and not committed, all clients together
MAX_PENDING_PER_PEER = 200_000  # ... one connection's share
MAX_WAITING = 10_000  # enqueues waiting for put reports, all clients together
MAX_WAITING_PER_PEER = 256
MAX_WAIT_S = 60.0
# The least a write waits on its slowest placed node past its first before hedging: a synced
# write on a busy host can lag another's by 20-40 ms, and a write's hedge costs a whole copy
WRITE_FLOOR_S = 0.05


@dataclass(slots=True)
class Pending:
    """One staged batch of items, durable on data nodes and not yet committed (memory only)."""

    queue: str
    ids: list[int]
    sizes: list[int]
    crcs: list[int]
    priorities: list[int]
    not_befores: list[float]
    keys: list[str]
    coalesce: bool
    nodes: tuple[str, ...]
    left: int  # items not committed yet
    peer: bytes  # the connection that staged them (its share of the cap)


@dataclass(slots=True, eq=False)
class Waiting:
    """An ``Enqueue`` parked until its ids are reported stored (or ``until``, monotonic)."""

    msg: p.Enqueue
    not_befores: list[float]
    peer: bytes
    rid: int
    until: float
    done: bool = False
    heard: set[str] = field(default_factory=set)  # nodes whose reports of it were timed
    first_report: float | None = None  # monotonic time its first node had reported it all


class Enqueues:
    """Enqueue and commit requests, the enqueues waiting for put reports, staged items."""

    def __init__(self, config: MasterConfig, state: State, log: Callable[[Any], None],
                 blocks: Blocks, deletes: Deletes, counts: QueueCounts | None = None,
                 policy: QueuePolicy | None = None) -> None:
        self.config = config
        self.policy = policy if policy is not None else QueuePolicy(config, state, lambda _: None)
        self.counts = counts if counts is not None else QueueCounts()
        self.state = state
        self.log = log
        self.blocks = blocks
        self.deletes = deletes
        self.pending: dict[int, Pending] = {}
        self.expiry: list[tuple[float, int, Pending]] = []  # (when, seq, batch)
        self.waiting: dict[str, Waiting] = {}  # by request id
        self.waiting_ids: dict[int, Waiting] = {}
        self.timeouts: list[tuple[float, int, Waiting]] = []
        self.hedges: list[tuple[float, int, Waiting]] = []  # (when to hedge, seq, enqueue)
        # from how far each node's reports of a parked enqueue lagged its first node's
        self.hedge_delays = HedgeDelays(floor_s=WRITE_FLOOR_S)
        self.hedged = 0  # enqueues answered PutAlso (a metric)
        self.by_queue: dict[str, int] = {}  # staged items per queue (for stats, no scan)
        self.by_peer: dict[bytes, int] = {}
        self.waiting_by_peer: dict[bytes, int] = {}
        self._seq = itertools.count()

    def count(self, queue: str) -> int:
        return self.by_queue.get(queue, 0)

    def drop_queue(self, queue: str) -> None:
        """Its staged items go, its parked enqueues fail (ids gone); their blobs are deleted."""
        self.blocks.drop([i for w in self.waiting.values() if w.msg.queue == queue
                          for i in w.msg.ids])
        for item_id, batch in [(i, b) for i, b in self.pending.items() if b.queue == queue]:
            self._drop_staged(item_id, batch)

    def forget_node(self, node_id: str) -> None:
        """A removed node holds nothing staged or placed: no commit or report re-adds it."""
        self.blocks.forget_node(node_id)
        for batch in {id(b): b for b in self.pending.values() if node_id in b.nodes}.values():
            batch.nodes = tuple(n for n in batch.nodes if n != node_id)

    def __contains__(self, item_id: int) -> bool:
        """True for ids handed out or staged: their blobs are not strays."""
        return item_id in self.pending or self.blocks.holds(item_id)

    # -- enqueue -----------------------------------------------------------------------------

    def enqueue(self, msg: p.Enqueue, now: float, mono: float, peer: bytes,
                rid: int) -> p.Committed | p.Stored | None:
        arguments.queue_name(msg.queue)
        if msg.only_existing and msg.queue not in self.state.queues:
            raise UnknownQueue(f"queue {msg.queue!r} does not exist (this enqueue may not "
                               "create it)")
        self.policy.may_create(msg.queue, peer)
        n = arguments.same_length(ids=msg.ids, sizes=msg.sizes, crcs=msg.crcs,
                               priorities=msg.priorities, delays=msg.delays, keys=msg.keys)
        arguments.batch(n)
        arguments.request_id(msg.request)
        if not msg.request:
            raise InvalidArgument("an enqueue needs a request id")
        arguments.seconds(msg.wait_s, "wait_s", low=0, high=MAX_WAIT_S)
        self._check_items(msg)
        if msg.coalesce and not all(msg.keys):
            raise InvalidArgument("coalescing needs a key on every item")
        if msg.uniques:
            self._check_uniques(msg, n, now)
        if msg.ttrs:
            if msg.hold or len(msg.ttrs) != n:
                raise InvalidArgument("ttrs are for enqueues, not staged items, one per item")
            if not math.isfinite(sum(msg.ttrs)) or max(msg.ttrs) > self.config.max_lease_s \
                    or any(t and t < MIN_LEASE_S for t in msg.ttrs) or min(msg.ttrs) < 0:
                raise InvalidArgument(f"an item's own lease (ttr) must be 0 (the queue's) or "
                                      f"{MIN_LEASE_S:g} to {self.config.max_lease_s:g} seconds")
        check_results(self.state, msg, n, msg.request in self.state.recent_commits
                      or msg.request in self.waiting)
        if msg.depends_on:
            check_dependencies(self.state, msg, n)
        if msg.request in self.state.recent_commits:  # a retry of an enqueue that landed
            return p.Committed(count=n, firsts=as_ids(self._retry_firsts(msg, now)))
        parked = self.waiting.get(msg.request)
        if parked is not None:  # a retry while the first is still waiting: answer the retry
            self._count(self.waiting_by_peer, parked.peer, -1)
            self._count(self.waiting_by_peer, peer, 1)
            parked.peer, parked.rid = peer, rid
            return None
        if len(set(msg.ids)) != n:
            raise InvalidArgument("an enqueue lists an id more than once")
        landed = self._landed(msg)  # a retry whose request id the master no longer remembers
        if landed is not None:
            return landed
        unknown = [i for i in msg.ids if not self.blocks.holds(i)]
        if unknown:
            raise UnknownItem(f"{len(unknown)} ids are not handed out (expired, or the master "
                              f"restarted), e.g. {unknown[:5]}; the enqueue must be redone")
        if any(i in self.waiting_ids for i in msg.ids):
            raise InvalidArgument("an id of this enqueue is in another enqueue still waiting")
        if msg.hold:
            self._check_pending_room(peer, n)
        if len(self.waiting) >= MAX_WAITING or \
                self.waiting_by_peer.get(peer, 0) >= MAX_WAITING_PER_PEER:
            raise TooManyItems("too many enqueues are waiting for their data nodes; retry later")
        not_befores = [now + d if d else 0.0 for d in msg.delays] if any(msg.delays) \
            else msg.delays
        parked = Waiting(msg, not_befores, peer, rid, mono + msg.wait_s)
        self._time_reports(parked, mono)
        reply = self._try(parked, now, mono)
        if reply is not None:
            self._forget_if_failed(msg, reply)
            return reply
        self.waiting[msg.request] = parked
        self.waiting_ids.update(dict.fromkeys(msg.ids, parked))
        self._count(self.waiting_by_peer, peer, 1)
        heapq.heappush(self.timeouts, (parked.until, next(self._seq), parked))
        self._hedge_later(parked, mono + self._hedge_delay(parked))
        return None

    def _landed(self, msg: p.Enqueue) -> p.Committed | p.Stored | None:
        """The answer to a retry of an enqueue that already landed, found by its ids."""
        if msg.hold:
            batches = [self.pending.get(i) for i in msg.ids]
            if all(batches):
                return p.Stored(sorted({n for b in batches if b is not None for n in b.nodes}))
            return None
        items = self.state.items
        return p.Committed(count=len(msg.ids)) if all(i in items for i in msg.ids) else None

    def _forget_if_failed(self, msg: p.Enqueue, reply: Any) -> None:
        """A failed enqueue's ids are dropped for good, so it can never land later (P3)."""
        if isinstance(reply, (p.Unstored, p.Error)):
            self.blocks.drop(msg.ids)

    @staticmethod
    def _count(counts: dict, key: Any, n: int) -> None:
        """Add ``n`` (maybe negative) to ``counts[key]``; a count at zero leaves the dict."""
        left = counts.get(key, 0) + n
        if left > 0:
            counts[key] = left
        else:
            counts.pop(key, None)

    def serve_waiting(self, now: float, mono: float) -> list[tuple[bytes, int, Any]]:
        """Replies for parked enqueues whose reports came in, or whose time ran out."""
        replies = []
        news = self.blocks.take_news()
        if news:
            touched = {self.waiting_ids[i] for i in news if i in self.waiting_ids}
            for parked in touched:
                self._time_reports(parked, mono)
                reply = self._try(parked, now, mono)
                if reply is not None:
                    replies.append(self._unpark(parked, reply))
        while self.hedges and self.hedges[0][0] <= mono:
            parked = heapq.heappop(self.hedges)[2]
            if parked.done:
                continue
            delay = self._hedge_delay(parked)
            if parked.first_report is None or mono < parked.first_report + delay:
                # no node reported yet, or the first one only just: look again later
                first = parked.first_report
                self._hedge_later(parked, mono + delay if first is None else first + delay)
                continue
            hedge = self.blocks.hedge(parked.msg.ids, now, mono)
            if hedge is None:  # no healthy spare now (or nothing lacking): look again later
                self._hedge_later(parked, mono + delay)
                continue
            self.hedged += 1
            replies.append(self._unpark(parked, hedge))
        while self.timeouts and self.timeouts[0][0] <= mono:
            parked = heapq.heappop(self.timeouts)[2]
            if not parked.done:
                replies.append(self._unpark(parked, self._unstored(parked.msg, "")))
        return replies

    def next_wake(self) -> float | None:
        """When the earliest parked enqueue is due its hedge or its timeout (None: none is
        parked). Entries of enqueues settled meanwhile are dropped here: they wake nobody."""
        soon = []
        for heap in (self.hedges, self.timeouts):
            while heap and heap[0][2].done:
                heapq.heappop(heap)
            if heap:
                soon.append(heap[0][0])
        return min(soon, default=None)

    def _hedge_delay(self, parked: Waiting) -> float:
        return self.hedge_delays.delay_s(nbytes=sum(parked.msg.sizes))

    def _hedge_later(self, parked: Waiting, when: float) -> None:
        """Look at ``parked`` again at ``when`` (monotonic), if before its time runs out."""
        if when < parked.until:
            heapq.heappush(self.hedges, (when, next(self._seq), parked))

    def _time_reports(self, parked: Waiting, mono: float) -> None:
        """Time each node's report of a parked enqueue, by how far it lagged the first node's
        (a node's reports come whole: its first and last id tell), for the hedge delay."""
        ids, holders = parked.msg.ids, self.blocks.holders
        for node in holders(ids[0]):
            if node not in parked.heard and node in holders(ids[-1]):
                parked.heard.add(node)
                if parked.first_report is None:
                    parked.first_report = mono
                self.hedge_delays.observe(node, mono - parked.first_report)

    def _unpark(self, parked: Waiting, reply: Any) -> tuple[bytes, int, Any]:
        """Answer a parked enqueue (a ``PutAlso`` leaves its ids held: it comes back)."""
        parked.done = True
        del self.waiting[parked.msg.request]
        for item_id in parked.msg.ids:
            self.waiting_ids.pop(item_id, None)
        self._count(self.waiting_by_peer, parked.peer, -1)
        self._forget_if_failed(parked.msg, reply)
        return parked.peer, parked.rid, reply

    def _try(self, parked: Waiting, now: float, mono: float) -> Any:
        """The enqueue's reply if it can be settled now, else None (still waiting)."""
        msg, min_replicas, blocks = parked.msg, self.config.quorum, self.blocks
        for item_id in msg.ids:
            if len(blocks.holders(item_id)) < min_replicas:
                if not blocks.holds(item_id):
                    return error_reply(UnknownItem(f"id {item_id} expired while its enqueue "
                                                   "waited; the enqueue must be redone"))
                if blocks.possible(item_id) < min_replicas:
                    return self._unstored(msg, blocks.why_refused(item_id))
                return None
        try:
            return self._settle_stored(parked, now, mono)
        except BlizzardError as exc:  # e.g. a record over the WAL's limit: nothing changed
            return error_reply(exc)

    def _unstored(self, msg: p.Enqueue, why: str) -> p.Unstored:
        """Nothing becomes visible: which placed nodes failed to report some id."""
        min_replicas, blocks = self.config.quorum, self.blocks
        missing: set[str] = set()
        for item_id in msg.ids:
            holders = blocks.holders(item_id)
            if len(holders) < min_replicas:
                missing.update(n for n in blocks.nodes_of(item_id) if n not in holders)
        return p.Unstored(sorted(missing), why or "no report from these data nodes in time")

    def _settle_stored(self, parked: Waiting, now: float, mono: float) -> p.Committed | p.Stored:
        """Every id has enough reports: log the items (or stage them with ``hold``)."""
        msg = parked.msg
        groups: dict[tuple[str, ...], list[int]] = {}  # holders -> positions in the request
        for k, item_id in enumerate(msg.ids):
            groups.setdefault(tuple(self.blocks.holders(item_id)), []).append(k)
        if msg.hold:  # one staged batch per set of holders, so each item keeps its own
            for nodes, at in groups.items():
                self._stage(msg, parked.not_befores, at, nodes, parked.peer, mono)
            self.blocks.release(msg.ids)
            return p.Stored(sorted({n for nodes in groups for n in nodes}))
        firsts: list[int] = []
        if any(msg.uniques):
            firsts = self._firsts(msg, now)
            taking = sum(1 for k, key in enumerate(msg.uniques) if key and firsts[k] == msg.ids[k])
            self._room_for_uniques(msg.queue, taking, now)  # parked meanwhile: checked again
            if firsts != msg.ids:  # some are not made: their copies go, the rest are logged
                for k, item_id in enumerate(msg.ids):
                    if firsts[k] != item_id:
                        self.deletes.drop_blobs(item_id, self.blocks.holders(item_id))
                groups = {nodes: [k for k in at if firsts[k] == msg.ids[k]]
                          for nodes, at in groups.items()}
                groups = {nodes: at for nodes, at in groups.items() if at}
        whole = len(groups) == 1 and not firsts
        until = now + msg.unique_for_s
        for nodes, at in groups.items():
            cols: list[list[Any]] = [msg.ids, msg.sizes, msg.crcs, msg.priorities,
                                     parked.not_befores, msg.keys]
            uniques, ttrs, result_of = msg.uniques, msg.ttrs, msg.result_of
            if not whole:
                cols = [[col[k] for k in at] for col in cols]
                uniques = [uniques[k] for k in at] if uniques else uniques
                ttrs = [ttrs[k] for k in at] if ttrs else ttrs
                result_of = [result_of[k] for k in at] if result_of else result_of
            self._log_items(msg.queue, nodes, msg.coalesce, msg.request, now, *cols,
                            uniques=uniques, unique_until=until, ttrs=ttrs,
                            result_of=result_of, result_kind=msg.result_kind,
                            depends_on=msg.depends_on,
                            on_dependency_failure=msg.on_dependency_failure)
        self.blocks.release(msg.ids)
        if firsts == msg.ids:
            firsts = []
        return p.Committed(count=len(msg.ids), firsts=as_ids(firsts))

    def _check_uniques(self, msg: p.Enqueue, n: int, now: float) -> None:
        if msg.hold:
            raise InvalidArgument("unique keys are for enqueues, not staged items")
        if len(msg.uniques) != n:
            raise InvalidArgument(f"{len(msg.uniques)} unique keys for {n} items: give one per "
                                  "item (\"\" for none)")
        arguments.seconds(msg.unique_for_s, "unique_for_s", low=0, high=MAX_UNIQUE_S,
                       low_ok=False)
        if max(map(len, msg.uniques)) > MAX_KEY:
            raise InvalidArgument(f"a unique key is at most {MAX_KEY} characters")
        self._room_for_uniques(msg.queue, n, now)

    def _room_for_uniques(self, queue: str, n: int, now: float) -> None:
        """``TooManyItems`` unless ``n`` more keys of ``queue`` fit; at a cap, the keys whose
        time is up are dropped first (an ``ExpireUniques`` record: a replay does the same)."""
        uniques = self.state.uniques
        if uniques.room(queue, n):
            self.log(ExpireUniques(at=now))
        full = uniques.room(queue, n)
        if full:
            raise TooManyItems(f"{full}; retry when some have run out (each lasts its "
                               "unique_for_s)")

    def _retry_firsts(self, msg: p.Enqueue, now: float) -> list[int]:
        """A retried enqueue's ``firsts`` ([] when every item was made): its items made, the
        rest the holders of their keys (as the first answer said)."""
        if not any(msg.uniques):
            return []
        items, uniques = self.state.items, self.state.uniques
        out = []
        for item_id, key in zip(msg.ids, msg.uniques, strict=True):
            holder = uniques.holder(msg.queue, key, now) if key and item_id not in items \
                else None
            out.append(item_id if holder is None else holder)
        return [] if out == list(msg.ids) else out

    def _firsts(self, msg: p.Enqueue, now: float) -> list[int]:
        """Per item, the id that stands for it: an earlier holder of its unique key (still
        queued or leased, with ``unique_live``), an earlier item of this enqueue with the
        same key, or its own."""
        uniques, items = self.state.uniques, self.state.items
        seen: dict[str, int] = {}
        out = []
        for item_id, key in zip(msg.ids, msg.uniques, strict=True):
            first = seen.get(key) if key else None
            if key and first is None:
                first = uniques.holder(msg.queue, key, now)
                if first is not None and msg.unique_live and first not in items:
                    first = None
            if key and first is None:
                seen[key] = item_id
            out.append(item_id if first is None else first)
        return out

    def _stage(self, msg: p.Enqueue, not_befores: list[float], at: list[int],
               nodes: tuple[str, ...], peer: bytes, mono: float) -> None:
        """Keep the items at positions ``at`` of ``msg`` pending, held by ``nodes``."""
        n = len(at)
        cols: list[list[Any]] = [msg.ids, msg.sizes, msg.crcs, msg.priorities, not_befores,
                                 msg.keys]
        if n != len(msg.ids):
            cols = [[col[k] for k in at] for col in cols]
        ids, sizes, crcs, priorities, befores, keys = cols
        batch = Pending(msg.queue, ids, sizes, crcs, priorities, befores, keys, msg.coalesce,
                        nodes, n, peer)
        self.pending.update(dict.fromkeys(batch.ids, batch))
        self.by_queue[msg.queue] = self.by_queue.get(msg.queue, 0) + n
        self.by_peer[peer] = self.by_peer.get(peer, 0) + n
        heapq.heappush(self.expiry, (mono + self.config.pending_timeout_s, next(self._seq), batch))

    def _check_pending_room(self, peer: bytes, n: int) -> None:
        if len(self.pending) + n > MAX_PENDING:
            raise TooManyItems(f"{len(self.pending)} items are staged and not committed; the "
                               f"master holds at most {MAX_PENDING} (commit or retry later)")
        if self.by_peer.get(peer, 0) + n > MAX_PENDING_PER_PEER:
            raise TooManyItems(f"this connection has {self.by_peer[peer]} items staged and "
                               f"not committed; at most {MAX_PENDING_PER_PEER}")

    def _log_items(self, queue: str, nodes: tuple[str, ...], coalesce: bool, request: str,
                   now: float, ids: list[int], sizes: list[int], crcs: list[int],
                   priorities: list[int], not_befores: list[float], keys: list[str], *,
                   uniques: Sequence[str] = (), unique_until: float = 0.0,
                   ttrs: Sequence[float] = (), result_of: Sequence[int] = (),
                   result_kind: int = 0, depends_on: Sequence[int] = (),
                   on_dependency_failure: int = 0) -> None:
        """Log one ``CommitItems`` record, then drop the blobs coalescing made obsolete (and
        the jobs' earlier results, which these replace)."""
        replaced = [old for key in (set(keys) if coalesce else ()) if key
                    for old in self.state.waiting_with_key(queue, key)]
        results, items = self.state.jobs.results, self.state.items
        replaced += [items[results[job].item] for job in result_of
                     if job in results and results[job].item in items]
        self.log(CommitItems(queue=queue, ids=ids, sizes=sizes, crcs=crcs, priorities=priorities,
                             not_befores=not_befores, keys=keys, coalesce=coalesce,
                             nodes=list(nodes), at=now, request=request,
                             uniques=list(uniques) if any(uniques) else [],
                             unique_until=unique_until if any(uniques) else 0.0,
                             ttrs=list(ttrs) if any(ttrs) else [],
                             result_of=list(result_of), result_kind=result_kind,
                             depends_on=list(depends_on),
                             on_dependency_failure=on_dependency_failure))
        # coalescing dropped older waiting items (and all but the last of a burst)
        gone = [(old.id, old.nodes) for old in replaced if old.id not in items]
        dropped = [(i, nodes) for i in ids if i not in items]
        self.counts.add("enqueued", queue, len(ids) - len(dropped))
        gone += dropped
        for item_id, holders in gone:
            self.deletes.drop_blobs(item_id, holders)

    def _check_items(self, msg: p.Enqueue) -> None:
        """Every item's size, checksum, priority, delay and key, whole columns at a time.

        The column test runs in C; only when it finds something is each item looked at, to
        name the offender.
        """
        low, high = PRIORITY_RANGE
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
        columns = zip(msg.crcs, msg.priorities, msg.delays, msg.keys, strict=True)
        for crc, prio, delay, key in columns:
            arguments.checksum(crc)
            arguments.priority(prio)
            arguments.seconds(delay, "delay_s", low=0, high=MAX_DELAY_S)
            if len(key) > MAX_KEY:
                raise InvalidArgument(f"a key is at most {MAX_KEY} characters")

    # -- commit (of staged items) -----------------------------------------------------------

    def size_and_crc(self, item_id: int) -> tuple[int, int]:
        """A staged item's size and checksum."""
        batch = self.pending[item_id]
        k = batch.ids.index(item_id)
        return batch.sizes[k], batch.crcs[k]

    def check_stager(self, msg: p.Commit, verify: Callable[[p.PutGrant], None]) -> None:
        """Forbidden unless each staged id of ``msg`` lies in one of its grants, each one
        ``verify``'d: staged ids are whoever's holds their placement's grant, as an enqueue's
        ids are (ids are sequential: anyone could name another producer's)."""
        if len(msg.grants) > p.MAX_BATCH:
            raise TooManyItems(f"{len(msg.grants)} grants in one commit; at most {p.MAX_BATCH}")
        staged = sorted(i for i in msg.ids if i in self.pending)
        if not staged:
            return  # a retry of a commit that landed, or unknown ids (refused by ``commit``)
        for grant in msg.grants:
            verify(grant)
        ranges = sorted((g.first, g.first + g.n) for g in msg.grants)
        uncovered, k = [], 0
        for item_id in staged:  # both in order: one walk
            while k < len(ranges) and ranges[k][1] <= item_id:
                k += 1
            if k == len(ranges) or item_id < ranges[k][0]:
                uncovered.append(item_id)
        if uncovered:
            raise Forbidden(f"{len(uncovered)} staged ids of this commit, e.g. {uncovered[:3]}, "
                            "lie in none of its grants: only who staged them (holding their "
                            "placements' grants, as Client.stage returns them) commits them")

    def commit(self, msg: p.Commit, now: float, *_: Any) -> p.Committed:
        arguments.batch(len(msg.ids))
        arguments.request_id(msg.request)
        arguments.node_ids(msg.stored_on, "stored_on")
        if len(set(msg.ids)) != len(msg.ids):
            raise InvalidArgument("a commit lists an id more than once")
        if msg.request and msg.request in self.state.recent_commits:
            return p.Committed(count=len(msg.ids))  # a retry of a commit that landed
        stored = set(msg.stored_on)
        pending, items = self.pending, self.state.items
        unknown = [i for i in msg.ids if i not in pending and i not in items]
        if unknown:
            raise UnknownItem(f"{len(unknown)} ids are not staged (expired, or the master "
                              f"restarted), e.g. {unknown[:5]}; the enqueue must be redone")
        # item ids grouped by what one CommitItems record shares: the staged batch, replicas
        groups: dict[tuple[int, tuple[str, ...]], list[int]] = {}
        for item_id in msg.ids:
            batch = pending.get(item_id)
            if batch is None:
                continue  # committed before: a retry
            # only nodes that reported the items count: a client's word for a node is no proof
            nodes = tuple(n for n in batch.nodes if n in stored)
            if len(nodes) < self.config.quorum:
                raise NotEnoughDatanodes(f"item {item_id} is stored on {len(nodes)} of its "
                                         f"nodes; {self.config.quorum} needed")
            groups.setdefault((id(batch), nodes), []).append(item_id)
        for (_batch_id, nodes), ids in groups.items():  # not ``_``: the extra arguments
            batch = pending[ids[0]]
            cols = self._columns(batch, ids)
            self._log_items(batch.queue, nodes, batch.coalesce, msg.request, now, ids, *cols)
            for item_id in ids:  # only now, with the record logged
                del pending[item_id]
            self._settle(batch, len(ids))
        return p.Committed(count=len(msg.ids))

    @staticmethod
    def _columns(batch: Pending, ids: list[int]) -> tuple[list, list, list, list, list]:
        """Sizes, checksums, priorities, not-befores and keys of staged items, in ``ids`` order.

        The usual commit is one whole staged batch, in order: its columns are taken as they are.
        """
        if ids == batch.ids:
            return batch.sizes, batch.crcs, batch.priorities, batch.not_befores, batch.keys
        where = {item_id: k for k, item_id in enumerate(batch.ids)}
        at = [where[i] for i in ids]
        return ([batch.sizes[k] for k in at], [batch.crcs[k] for k in at],
                [batch.priorities[k] for k in at], [batch.not_befores[k] for k in at],
                [batch.keys[k] for k in at])

    def _settle(self, batch: Pending, n: int) -> None:
        """``n`` of a batch's items left the pending table (committed or expired)."""
        batch.left -= n
        if not batch.left:  # its expiry entry lingers until the deadline; its columns need not
            batch.ids = batch.sizes = batch.crcs = batch.priorities = []
            batch.not_befores, batch.keys = [], []
        self._count(self.by_queue, batch.queue, -n)
        self._count(self.by_peer, batch.peer, -n)

    # -- expiry ------------------------------------------------------------------------------

    def expire(self, mono: float) -> None:
        """Drop staged items not committed in time; their blobs are deleted."""
        self.blocks.expire(mono)
        while self.expiry and self.expiry[0][0] <= mono:
            batch = heapq.heappop(self.expiry)[2]
            if not batch.left:
                continue
            for item_id in batch.ids:
                if self.pending.get(item_id) is batch:
                    self._drop_staged(item_id, batch)

    def _drop_staged(self, item_id: int, batch: Pending) -> None:
        del self.pending[item_id]
        self._settle(batch, 1)
        self.deletes.drop_blobs(item_id, batch.nodes)
