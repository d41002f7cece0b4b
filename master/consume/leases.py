"""Leases: take items from a queue's head, settle them (ack, nack, extend), expire them.

Also the long-poll waiters (a lease request parked until items come, or its time is up) and
the per-queue token buckets that rate-limit leases of new items across all consumers
(redeliveries pass without a token: ``master/state/picking.py``). A lease's timeout
lives here: ``expire`` returns items whose deadline passed to their queues.
"""

from __future__ import annotations

import logging
import os
import struct
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from blizzard.host.log_limit import Throttled
from blizzard.server.router import error_reply
from blizzard.wire import protocol as p
from blizzard.wire.errors import BlizzardError, InvalidArgument, TooManyItems
from blizzard.wire.limits import MAX_DELAY_S, MAX_LEASE_WAIT_S
from blizzard.wire.queue_settings import RESULTS_SUFFIX
from master.config import MasterConfig
from master.consume.progress import Progress
from master.consume.schedule_runs import ScheduleRuns
from master.nodes.blob_deletes import Deletes
from master.nodes.grant_keys import CapabilityKeys
from master.nodes.membership import Membership
from master.rules import arguments
from master.shard.heads import Heads
from master.state.counts import QueueCounts
from master.state.item import DELAYED, LEASED, columns
from master.state.machine import State
from master.state.queue_config import TokenBucket
from master.state.records import AckItems, LeaseItems, ReleaseItems

log = logging.getLogger(__name__)
refused_log = Throttled(log)  # a consumer acking wrong ids all day makes a line per 10 s

MAX_WAITERS = 10_000  # parked long polls, all connections together
MAX_WAITERS_PER_PEER = 256  # ... one connection's share
# ... and one key's, over all its connections: a key that opens many connections cannot take
# every slot (a fleet of workers sharing one key has this many long polls parked at most)
MAX_WAITERS_PER_KEY = 2_000
MAX_ERROR = 2000  # characters of a nack's error kept with the item


LOST_NAMES = {p.LOST_EXPIRED: "lease expired", p.LOST_UNKNOWN: "unknown id",
              p.LOST_OTHER_QUEUE: "in another queue", p.LOST_WRONG_TOKEN: "wrong token"}


def fresh_tokens(n: int) -> list[int]:
    """``n`` lease tokens nobody can guess: 63 random bits each, never 0 (0: not leased).

    A token is what lets a consumer settle an item; handed out in sequence, a client could
    ack or extend the items another consumer holds by trying the tokens next to its own.
    The WAL keeps each token, so a replay and the standby hold the same ones.
    """
    return [(x >> 1) | 1 for x in struct.unpack(f"<{n}Q", os.urandom(8 * n))]


@dataclass(slots=True)
class Settled:
    """What an ack, nack or extend found: ids held under the tokens given, ids refused (and
    why, ``p.LOST_*``), and how many were already acked under the very token (a retry)."""

    held: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    why: list[int] = field(default_factory=list)
    gone: int = 0

    def refuse(self, item_id: int, why: int) -> None:
        self.lost.append(item_id)
        self.why.append(why)

    def reply(self) -> p.Acked:
        return p.Acked(done=len(self.held) + self.gone, lost=self.lost, why=self.why)


@dataclass(slots=True)
class Waiter:
    """A long-polling lease request parked until items (and rate tokens) are there, or time is
    up."""

    peer: bytes
    rid: int
    msg: p.Lease
    until: float  # monotonic
    key: str = ""  # the public key its connection authenticated with ("": security off)
    fd: int = -1  # its connection's descriptor (``blizzard/server/departures.py``; -1: unknown)


class Leases:
    """Lease, ack, nack, extend and expiry; long-poll waiters; rate limits."""

    def __init__(self, config: MasterConfig, state: State, log_record: Callable[[Any], None],
                 deletes: Deletes, membership: Membership, capabilities: CapabilityKeys,
                 counts: QueueCounts | None = None, heads: Heads | None = None, *,
                 schedule_runs: ScheduleRuns | None = None,
                 connection_of: Callable[[bytes], tuple[str, int]] = lambda peer: ("", -1),
                 key_admitted: Callable[[str], bool] = lambda key: True,
                 progress: Progress | None = None) -> None:
        self.config = config
        self.heads = heads  # tells the queue's head after a lease that asks (sharding)
        self.counts = counts if counts is not None else QueueCounts()
        self.state = state
        self.log = log_record
        self.deletes = deletes
        self.membership = membership
        self.capabilities = capabilities
        self.waiters: list[Waiter] = []
        self.waiting_by_peer: dict[bytes, int] = {}
        self.waiting_by_key: dict[str, int] = {}
        # a peer's key and descriptor, for the request being handled (the server's router)
        self.connection_of = connection_of
        # whether a connection's key is still admitted (a removed, retired or expired one is
        # not): a parked long poll of a revoked key must not lease items nobody will get
        self.key_admitted = key_admitted
        self.buckets: dict[str, TokenBucket] = {}  # queue -> rate limiter (soft state)
        # an extension's progress: checked first, then logged for the items it held
        # (master/consume/progress.py; None: extensions' progress is ignored)
        self.progress = progress
        # schedules' items: their runs' ends re-arm them (master/consume/schedule_runs.py)
        self.schedule_runs = schedule_runs

    # -- leasing -----------------------------------------------------------------------------

    def lease_request(self, msg: p.Lease, now: float, mono: float, peer: bytes,
                      rid: int) -> p.Leased | None:
        arguments.queue_name(msg.queue)
        if msg.queue.endswith(RESULTS_SUFFIX):
            raise InvalidArgument(f"queue {msg.queue} holds task results, which are read, not "
                                  "leased: handle.result() or `blizzard job ID`")
        arguments.batch(msg.n)
        arguments.seconds(msg.lease_s, "lease_s", low=0, high=self.config.max_lease_s)
        arguments.seconds(msg.wait_s, "wait_s", low=0, high=MAX_LEASE_WAIT_S)
        arguments.request_id(msg.request)
        if msg.ids:  # checked before anything (a parked lease is taken again later)
            arguments.batch(len(msg.ids))
        key, fd = self.connection_of(peer) if msg.wait_s else ("", -1)
        if msg.wait_s:
            self._check_slots(peer, key)
        lost: list[int] = []
        if msg.ack_ids:
            lost = self._ack(msg.ack_ids, msg.ack_leases).lost
        if msg.request in self.state.recent_leases:  # a retry: the same items again
            return self._described(msg, self.state.leased_by(msg.request), lost, now)
        ids = self._take(msg, now, mono)
        if ids or msg.wait_s == 0 or lost:  # lost acks are news the caller must get now
            return self._described(msg, ids, lost, now)
        # parked without its acks (settled above): a waiter holds only what it needs later
        self.waiters.append(Waiter(peer, rid, p.replace(msg, ack_ids=[], ack_leases=[]),
                                   mono + msg.wait_s, key, fd))
        self.waiting_by_peer[peer] = self.waiting_by_peer.get(peer, 0) + 1
        if key:
            self.waiting_by_key[key] = self.waiting_by_key.get(key, 0) + 1
        return None

    def _check_slots(self, peer: bytes, key: str) -> None:
        """``TooManyItems`` if a long poll of ``peer`` (of ``key``) may not park now."""
        if len(self.waiters) >= MAX_WAITERS:
            held = f"{len(self.waiters)} long polls wait, the most the master parks"
        elif self.waiting_by_peer.get(peer, 0) >= MAX_WAITERS_PER_PEER:
            held = (f"this connection has {MAX_WAITERS_PER_PEER} long polls waiting, "
                    "the most one may")
        elif key and self.waiting_by_key.get(key, 0) >= MAX_WAITERS_PER_KEY:
            held = f"this key's connections have {MAX_WAITERS_PER_KEY} long polls waiting, the " \
                   "most one key may"
        else:
            return
        raise TooManyItems(f"too many long polls waiting: {held} (at most {MAX_WAITERS_PER_PEER} "
                           f"per connection, {MAX_WAITERS_PER_KEY} per key, {MAX_WAITERS} in all)")

    def _unpark(self, w: Waiter) -> None:
        """Give back the slot ``w`` held (the caller takes it out of ``waiters``)."""
        left = self.waiting_by_peer[w.peer] - 1
        if left:
            self.waiting_by_peer[w.peer] = left
        else:
            del self.waiting_by_peer[w.peer]
        if w.key:
            left = self.waiting_by_key[w.key] - 1
            if left:
                self.waiting_by_key[w.key] = left
            else:
                del self.waiting_by_key[w.key]

    def drop_departed(self, fds: set[int]) -> int:
        """Forget the long polls of connections that ended (their descriptors): nobody is
        there to answer, and their slots are free again. How many were dropped."""
        if not fds or not self.waiters:
            return 0
        gone = [w for w in self.waiters if w.fd in fds]
        if gone:
            for w in gone:
                self._unpark(w)
            self.waiters = [w for w in self.waiters if w.fd not in fds]
            log.info("%d long polls of %d departed connections dropped", len(gone), len(fds))
        return len(gone)

    def _take(self, msg: p.Lease, now: float, mono: float) -> list[int]:
        config = self.state.config(msg.queue)
        if config.paused_until > now:  # paused: nothing of it is handed out, named or not
            return []
        if config.rate_per_s > 0:  # one bucket per queue: a global limit over all consumers
            bucket = self.buckets.get(msg.queue)
            if bucket is None:
                bucket = self.buckets[msg.queue] = TokenBucket(config.rate_per_s, config.burst)
            tokens = bucket.take(msg.n, mono)
            # only new items need a token; redeliveries pass (``master/state/picking.py``)
            ids = self._named(msg.queue, msg.ids, msg.n, tokens, now) if msg.ids \
                else self.state.head(msg.queue, msg.n, now, new=tokens)
            fresh = sum(1 for i in ids if self.state.items[i].attempts == 0)
            bucket.tokens += tokens - fresh  # unused grants go back
        elif msg.ids:  # these items, those ready or delayed in the queue
            ids = self._named(msg.queue, msg.ids, msg.n, now=now)
        else:
            ids = self.state.head(msg.queue, msg.n, now)
        if ids:
            lease_s = msg.lease_s or config.lease_s
            ttrs = self.state.ttrs
            own = [ttrs.get(i, 0.0) for i in ids] if ttrs and not msg.lease_s else []
            ends = [now + (t or lease_s) for t in own] if any(own) else []
            self.log(LeaseItems(ids=ids, leases=fresh_tokens(len(ids)),
                                deadline=now + lease_s, request=msg.request, deadlines=ends))
            self.counts.add("leased", msg.queue, len(ids))
        return ids

    def _named(self, queue: str, wanted: list[int], n: int, new: int | None = None,
               now: float = 0.0) -> list[int]:
        """Of ``wanted``, at most ``n`` in ``queue``, ready or delayed (by its producer, not
        by a retry's back-off, which the queue's settings set), whose key (if any) no leased
        item holds (beanstalkd's ``reserve-job``); ``new``: at most that many never
        delivered (a rate-limited queue's tokens). Never a job waiting for its dependencies,
        nor a schedule's item before its tick."""
        state = self.state
        items, q = state.items, state.queues.get(queue)
        waiting, scheduled = state.jobs.waiting, state.schedules.by_item
        out: list[int] = []
        keys: set[str] = set()
        for item_id in dict.fromkeys(wanted):
            item = items.get(item_id)
            if item is None or item.queue != queue or item.status == LEASED or q is None:
                continue
            if item.status == DELAYED and (item.attempts or item_id in waiting or (
                    item_id in scheduled and state.delays.get(item_id, 0.0) > now)):
                continue  # a retry's back-off, dependencies or a schedule's tick hold it
            if item.key and (item.key in q.active or item.key in keys):
                continue
            if new is not None and item.attempts == 0:
                if new <= 0:
                    continue
                new -= 1
            keys.add(item.key)
            out.append(item_id)
            if len(out) >= n:
                break
        return out

    def _described(self, msg: p.Lease, ids: list[int], lost: list[int], now: float) -> p.Leased:
        """``describe``, with the queue's head after the lease if the lease asked for it."""
        if not msg.head or self.heads is None:
            return self.describe(msg.queue, ids, lost, now)
        return self.describe(msg.queue, ids, lost, now,
                             self.heads.head(p.Head(msg.queue), now))

    def describe(self, queue: str, ids: list[int], lost: list[int], now: float,
                 head: p.QueueHead | None = None) -> p.Leased:
        """Describe items column by column; replica sets are shared between items.

        With a grant to read them from the nodes named (the reply to a lease or a peek), and
        ``head``, the queue's head after the lease, when the lease asked for it.
        """
        state = self.state
        items = state.items
        sizes, crcs, attempts, priorities, enqueued_at, keys, nodes_of = columns(
            [items[i] for i in ids], "size", "crc", "attempts", "priority", "enqueued_at", "key",
            "nodes")
        set_index: dict[tuple[str, ...], int] = {}
        replica_set = [set_index.setdefault(nodes, len(set_index)) for nodes in nodes_of]
        lookup = state.held.get
        held = [lookup(i) for i in ids]
        leases = [h[0] if h is not None else 0 for h in held]
        ends = [h[1] for h in held if h is not None]  # the grant ends with the leases
        until = max(ends) if ends else None
        addrs = state.node_addrs
        holders = {node for nodes in set_index for node in nodes}
        errors, ttrs, jobs = state.errors, state.ttrs, state.jobs
        own = [ttrs.get(i, 0.0) for i in ids] if ttrs else []
        by_item = state.schedules.by_item
        ticks = [state.schedules.by_name[by_item[i]].next_at if i in by_item else 0.0
                 for i in ids] if by_item else []
        saved = [jobs.state_of(i) for i in ids] if jobs.progress else []
        of_head: dict[str, Any] = {} if head is None else {
            "head_ready": head.ready, "head_priority": head.priority,
            "head_at": head.enqueued_at, "head_seq": head.seq}
        return p.Leased(queue, ids, leases, sizes, crcs, attempts, priorities, enqueued_at, keys,
                        replica_set,
                        [p.ReplicaSet(self.membership.refs(nodes, addrs)) for nodes in set_index],
                        lost, self.capabilities.get_grant(ids, list(holders), now, until),
                        [errors.get(i, "") for i in ids] if errors else [""] * len(ids),
                        suspects=self.membership.suspects(time.monotonic()),
                        ttrs=own if any(own) else [],
                        states=saved if any(saved) else [],
                        ticks=ticks if any(ticks) else [], **of_head)

    # -- settling ----------------------------------------------------------------------------

    def _settle(self, ids: list[int], leases: list[int], queue: str = "",
                late: bool = False) -> Settled:
        """Split (id, lease) pairs into still-held leases, refused ones (with why), and ids
        already gone under this very lease (a retry). ``queue``: every id must be in it."""
        arguments.batch(arguments.same_length(ids=ids, leases=leases))
        if queue:
            arguments.queue_name(queue)
        out = Settled()
        acked, holding, items = self.state.recent_acks, self.state.held, self.state.items
        if len(set(ids)) != len(ids):  # an id named twice counts once (its first lease)
            pairs = dict(zip(reversed(ids), reversed(leases), strict=True))
            ids, leases = list(pairs), list(pairs.values())
        for item_id, lease in zip(ids, leases, strict=True):
            item = items.get(item_id)
            if item is None:
                if item_id not in acked:
                    out.refuse(item_id, p.LOST_UNKNOWN)
                elif acked[item_id] == lease:
                    out.gone += 1  # acked under this very lease: a retry
                else:
                    out.refuse(item_id, p.LOST_EXPIRED)  # another consumer's delivery was acked
                continue
            h = holding.get(item_id)  # (lease, deadline); only items there are leased
            if queue and item.queue != queue \
                    and self.state.origins.get(item_id) != queue:  # a dead item: either name
                out.refuse(item_id, p.LOST_OTHER_QUEUE)
            elif h is not None and h[0] == lease:
                out.held.append(item_id)
            elif h is not None:
                out.refuse(item_id, p.LOST_WRONG_TOKEN)
            elif late and self.state.lapsed.get(item_id) == lease:
                out.held.append(item_id)  # its lease ran out, and no one leased it since
            elif acked.get(item_id) == lease:
                out.gone += 1  # a schedule's run acked under this lease: a retry
            else:
                out.refuse(item_id, p.LOST_EXPIRED)  # not leased: back in its queue
        return out

    def ack(self, msg: p.Ack, *_: Any) -> p.Acked | None:
        """Settle for good; a quiet ack gets no reply (None): what it could not settle is
        counted (``refused_acks``, in the metrics) and logged."""
        acked = self._ack(msg.ids, msg.leases, msg.queue, msg.late)
        if not msg.quiet:
            return acked
        if acked.lost:
            self.counts.refuse_acks(acked.why)
            n = len(acked.lost)
            refused_log("quiet ack", "quiet ack refused for %d item%s (%s), e.g. %s", n,
                        "s" * (n != 1), ", ".join(f"{k} {LOST_NAMES[why]}" for why, k in
                                                  sorted(Counter(acked.why).items())),
                        acked.lost[:5])
        return None

    def _ack(self, ids: list[int], leases: list[int], queue: str = "",
             late: bool = False) -> p.Acked:
        out = self._settle(ids, leases, queue, late)
        held = out.held
        if held and self.schedule_runs is not None:
            again, held = self.schedule_runs.split(held)
            self.schedule_runs.rearm(again, time.time())
            self.counts.add_each("acked", [self.state.items[i].queue for i in again])
        if held:
            items = self.state.items
            queues, holders = columns([items[i] for i in held], "queue", "nodes")
            self.log(AckItems(ids=held))
            self.counts.add_each("acked", queues)
            self.deletes.drop_blobs_of(held, holders)
        return out.reply()

    def nack(self, msg: p.Nack, now: float, *_: Any) -> p.Acked:
        if msg.delay_s is not None:
            arguments.seconds(msg.delay_s, "delay_s", low=0, high=MAX_DELAY_S)
        if msg.priority is not None:
            arguments.priority(msg.priority)
        out = self._settle(msg.ids, msg.leases, msg.queue)
        if out.held:
            self.counts.add_each("nacked", [self.state.items[i].queue for i in out.held])
            self.release(out.held, now, msg.delay_s, msg.error[:MAX_ERROR], msg.priority)
        return out.reply()

    def release(self, ids: list[int], now: float, delay_s: float | None, error: str = "",
                priority: int | None = None) -> None:
        """Give leased items back: after ``delay_s``, or (None) after their queue's back-off;
        with ``priority``, at that priority."""
        not_befores, dying, rearmed = [], [], []
        scheduled = self.state.schedules.by_item
        for item_id in list(ids):
            item = self.state.items[item_id]
            config = self.state.config(item.queue)
            dies = self.state.dies(item_id, item.attempts + 1, config.max_attempts)
            if dies and item_id in scheduled:
                rearmed.append(item_id)  # a schedule's run failed for good: its next tick
                continue
            delay = delay_s if delay_s is not None else config.backoff_s(item.attempts + 1)
            not_befores.append(now + delay if delay > 0 else 0.0)
            if dies:
                dying.append(item.queue)
        if rearmed:
            assert self.schedule_runs is not None  # (scheduled items exist only with it)
            self.schedule_runs.rearm(rearmed, now, error or "failed")
            ids = [i for i in ids if i not in rearmed]
            if not ids:
                return
        self.counts.add_each("dead_lettered", dying)
        self.log(ReleaseItems(ids=ids, not_befores=not_befores, error=error,
                              priorities=[] if priority is None else [priority] * len(ids)))

    def extend(self, msg: p.Extend, now: float, *_: Any) -> p.Acked:
        arguments.seconds(msg.lease_s, "lease_s", low=0, high=self.config.max_lease_s, low_ok=False)
        progress = self.progress if msg.progress_ids else None
        if progress is not None:
            progress.check(msg)  # a refused extension changes nothing
        out = self._settle(msg.ids, msg.leases, msg.queue)
        if out.gone:  # acked already: nothing to extend
            for i in msg.ids:
                if i not in self.state.items and i not in out.lost:
                    out.refuse(i, p.LOST_EXPIRED)
            out.gone = 0
        if out.held:
            holding = self.state.held
            self.log(LeaseItems(ids=out.held, leases=[holding[i][0] for i in out.held],
                                deadline=now + msg.lease_s, request=""))
        if progress is not None:
            progress.take(msg, out.held, time.monotonic())
        cancels = self.state.jobs.cancels
        cancel = [i for i in out.held if i in cancels] if cancels else []
        return p.replace(out.reply(), cancel=cancel) if cancel else out.reply()

    def regrant(self, msg: p.Regrant, now: float, *_: Any) -> p.Regranted:
        """A fresh read grant for the items still leased under the tokens given, until the
        latest of their leases ends (a grant ends with the leases it came with)."""
        settled = self._settle(msg.ids, msg.leases)
        held, lost = settled.held, settled.lost
        nodes = {node for i in held for node in self.state.items[i].nodes}
        until = max((self.state.held[i][1] for i in held), default=now)
        return p.Regranted(self.capabilities.get_grant(held, list(nodes), now, until), lost)

    # -- timers ------------------------------------------------------------------------------

    def expire(self, now: float) -> None:
        """Items whose lease ran out go back to their queues (after their back-off)."""
        expired = self.state.expired(now)
        if expired:
            log.info("%d leases expired; items return to their queues", len(expired))
            self.counts.add_each("expired", [self.state.items[i].queue for i in expired])
            self.release(expired, now, None, "lease expired")

    def next_wake(self) -> float | None:
        """When the soonest long poll runs out (monotonic), if any waits."""
        return min(w.until for w in self.waiters) if self.waiters else None

    def serve_waiters(self, now: float, mono: float) -> list[tuple[bytes, int, Any]]:
        """Replies for waiters whose items came or whose time is up; the rest keep waiting.
        A waiter whose lease fails now is answered with the error, the others served."""
        if not self.waiters:
            return []
        replies: list[tuple[bytes, int, Any]] = []
        still: list[Waiter] = []
        dry: set[str] = set()  # queues that gave one waiter nothing: no other gets more now
        admitted: dict[str, bool] = {}  # each key asked once a pass, however many waiters
        for w in self.waiters:
            if w.key:
                ok = admitted.get(w.key)
                if ok is None:
                    ok = admitted[w.key] = self.key_admitted(w.key)
                if not ok:  # revoked since it parked: dropped
                    self._unpark(w)
                    continue
            named = bool(w.msg.ids)  # a lease of named items says nothing of the queue's head
            try:
                ids = [] if w.msg.queue in dry and not named else self._take(w.msg, now, mono)
            except BlizzardError as exc:
                replies.append((w.peer, w.rid, error_reply(exc)))
                self._unpark(w)
                continue
            if not ids and not named:
                dry.add(w.msg.queue)
            if ids or w.until <= mono:
                replies.append((w.peer, w.rid, self.describe(w.msg.queue, ids, [], now)))
                self._unpark(w)
            else:
                still.append(w)
        self.waiters = still
        return replies
