"""A client of a sharded queue: several masters, each a whole cluster holding part of every queue.

``Client(["tcp://a:5555", "tcp://b:5556", ...])`` (or a string with the shards' addresses
separated by spaces) makes a ``ShardedClient``: one ``Client`` per shard, in shard order, and
the routing between them. A shard is any master (with its standby: ``"tcp://a,tcp://a2"``,
commas, never a list or spaces: a list naming a master and its own standby is refused)
started with ``--shard K``, so its ids start at ``K << 56`` and every id names its shard
(``blizzard/wire/shard_messages.py``): acks, nacks, extends, reads and deletes go straight there.

- An enqueue goes to one shard: by its key if it has one (a CRC of the key, so all of a key's
  items share a shard and keep their exclusivity and coalescing), else to a random one.
- A lease goes to the shard with the best head among those looked at
  (``blizzard/client/sharded/pick.py``:
  peek-d or the published heads), so order is relaxed: an item may be served while a better
  one waits on another shard (measured as the PEI by ``scripts/bench-pei``).
- Counters add up over the shards and settings go to all of them
  (``blizzard/client/sharded/admin.py``).

The shard count is part of the queue: a key maps to ``crc32(key) % shards``, so clients must
list the same shards in the same order (each master checks its place: ``Welcome.shard``).
"""

from __future__ import annotations

import random
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from blizzard.client.consumer import Consumer
from blizzard.client.jobs import JobStatus
from blizzard.client.message import LeasedItem, Message, leased_items
from blizzard.client.pipeline import Staged
from blizzard.client.schedules import ScheduleStatus
from blizzard.client.sharded.acks import ConsumerAcks
from blizzard.client.sharded.admin import (
    merge_queues,
    merge_stats,
    merge_status,
    shard_settings,
    whole_settings,
)
from blizzard.client.sharded.pick import DOWN_S, LEASE_ATTEMPT_S, UNAVAILABLE, ShardPicker
from blizzard.client.sharded.view import HeadsFeed, HeadsView
from blizzard.client.sharded.writes import ShardedProducer, ShardedStager, ShardLeases
from blizzard.client.sharded.writes import pairs as _pairs
from blizzard.net.transport import call, call_many
from blizzard.wire import protocol as p
from blizzard.wire.errors import (
    BlizzardError,
    ClientClosed,
    DataCorrupt,
    DatanodeUnavailable,
    Forbidden,
    InvalidArgument,
    LeaseExpired,
    MasterUnavailable,
    NotInQueue,
    QueueExists,
    UnknownItem,
    UnknownQueue,
)
from blizzard.wire.shard_messages import MAX_SHARDS, shard_of

QUIET_S = 0.5  # a shard not heard from this long is asked whether it lives before an enqueue
PROBE_S = 1.0  # and given this long to answer
CHECK_S = 0.5  # how long a new client waits for the masters' Hello (a silent one: checked later)
ONE_SHARD = ("a primary and its standbys are one shard, one string with commas between: "
             '"{}" (a list, or addresses separated by spaces, names different shards)')


def split_shards(masters: str | Sequence[str]) -> list[str]:
    """The shards of ``"tcp://a tcp://b"`` or of a list (each may be ``primary,standby``);
    an address in two shards is refused."""
    shards = masters.split() if isinstance(masters, str) else [str(m).strip() for m in masters]
    if not 1 <= len(shards) <= MAX_SHARDS:
        raise InvalidArgument(f"give between 1 and {MAX_SHARDS} shards, got {len(shards)}")
    shard_of_addr: dict[str, int] = {}
    for k, shard in enumerate(shards):
        for addr in filter(None, (a.strip() for a in shard.split(","))):
            if shard_of_addr.setdefault(addr, k) != k:
                raise InvalidArgument(f"{addr} is listed as shard {shard_of_addr[addr]} and as "
                                      f"shard {k}: a master serves one shard")
    return shards


def key_shard(key: str, shards: int) -> int:
    """The shard every item with ``key`` goes to."""
    return zlib.crc32(key.encode("utf-8")) % shards


class ShardedClient:
    """``Client``'s calls over several shards (see the module text). Not thread-safe."""

    def __init__(self, masters: Sequence[str], make: Callable[..., Any], *, peeks: int = 2,
                 heads: bool = True, **options: Any) -> None:
        self.shards = [make(m, **options) for m in masters]
        first = self.shards[0]
        self.ctx, self.timeout_s, self.keys = first.ctx, first.timeout_s, first.keys
        self.view = HeadsView()
        self.feed = HeadsFeed(self.ctx, self.view, self.keys) if heads else None
        self.picker = ShardPicker(self.shards, peeks, self.feed, self.view, self._hello)
        self.leases = ShardLeases(self.shards)
        self._checked: dict[int, str] = {}  # shard -> the master that answered our Hello
        self.heard: dict[int, float] = {}  # shard -> when a keyless enqueue last got through
        self.acks = ConsumerAcks(self.shards, self._by_shard, self.picker.is_down)
        self.unanswered: dict[int, str] = {}  # shards the last ``status`` did not hear, and why
        self.rng = random.Random()

    @classmethod
    def open(cls, masters: Sequence[str], make: Callable[..., Any],
             **options: Any) -> ShardedClient:
        """A client of these shards' masters (``make`` makes each shard's client), refused
        (``InvalidArgument``) if one of them is the standby of another shard's master."""
        sharded = cls(masters, make, **options)
        try:
            sharded.refuse_standbys()  # [A, B] with B A's standby meant "A,B"
        except BaseException:
            sharded.close()
            raise
        return sharded

    def __enter__(self) -> ShardedClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.acks.close()
        for shard in self.shards:
            shard.close()
        if self.feed is not None:
            self.feed.close()

    def refuse_standbys(self) -> None:
        """``InvalidArgument`` if a shard's master is the standby of another shard's (the list
        meant one shard: ``"A,B"``, not ``[A, B]`` or ``"A B"``). Every master is asked at once,
        for ``CHECK_S`` at most; one silent now is checked at its first use (``_hello``)."""
        asked = [(k, ep) for k, shard in enumerate(self.shards)
                 for ep in shard.master.all_endpoints()]
        replies = call_many([(ep, p.Hello()) for _, ep in asked], CHECK_S)
        for (k, ep), welcome in zip(asked, replies, strict=True):
            if isinstance(welcome, p.Welcome) and welcome.primary:
                self._refuse_standby(k, ep.addr, welcome.primary)

    def _refuse_standby(self, k: int, addr: str, primary: str) -> None:
        """Refuse shard ``k``'s master ``addr`` if the ``primary`` it follows is listed as
        another shard."""
        masters = [shard.master.addr.split(",") for shard in self.shards]
        listed = {a: j for j, addrs in enumerate(masters) for a in addrs}
        for other in filter(None, (a.strip() for a in primary.split(","))):
            j = listed.get(other, k)
            if j != k:
                one = ",".join(dict.fromkeys(masters[j] + masters[k]))
                raise InvalidArgument(f"{addr} (listed as shard {k}) is the standby of {other} "
                                      f"(listed as shard {j}): {ONE_SHARD.format(one)}")

    def _hello(self, k: int) -> None:
        """Before shard ``k`` is first used, and after its standby took over: check it is
        shard ``k`` (a client listing shards in another order would put keys elsewhere), and
        join its master's heads feed."""
        link = self.shards[k].master
        if self._checked.get(k) == link.endpoint.addr:
            return
        welcome = link.call(p.Hello(), since=time.monotonic() - link.timeout_s  # not for long:
                            + min(LEASE_ATTEMPT_S, link.timeout_s))  # a dead shard is passed over
        if welcome.primary:  # a standby not yet promoted: it tells no shard, and serves nothing
            self._refuse_standby(k, link.endpoint.addr, welcome.primary)
            link.move_on(p.Error("not_primary", ""))  # the shard's other master next time
            raise MasterUnavailable(f"shard {k}'s master {link.addr} is a standby (of "
                                    f"{welcome.primary}); its primary did not answer")
        if welcome.shard != k:
            raise InvalidArgument(f"master {self.shards[k].master.addr} is shard {welcome.shard},"
                                  f" listed as shard {k}: list every shard, in shard order")
        if self.feed is not None:
            self.feed.connect(welcome.heads)
            if not welcome.heads:  # started without --heads-bind: asked before each lease
                self.picker.feedless.add(k)
        self._checked[k] = link.endpoint.addr

    def _shard(self, k: int) -> Any:
        self._hello(k)
        return self.shards[k]

    def shard_for(self, key: str | None) -> int:
        """The shard an enqueue with ``key`` goes to (none: a random one of those answering)."""
        if key:
            return key_shard(key, len(self.shards))
        up = self.picker.up()  # a shard that did not answer lately is passed over for a while
        return self.rng.choice(up) if up else self.rng.randrange(len(self.shards))

    def _by_shard(self, msgs: Iterable[Any]) -> dict[int, list[Any]]:
        groups: dict[int, list[Any]] = {}
        for m in msgs:
            groups.setdefault(self._shard_of(m.id), []).append(m)
        return groups

    def _shard_of(self, item_id: int) -> int:
        k = shard_of(item_id)
        if k >= len(self.shards):
            raise InvalidArgument(f"item id {item_id} is of shard {k}; this client has "
                                  f"{len(self.shards)} shards")
        return k

    # -- enqueue -----------------------------------------------------------------------------

    def enqueue(self, queue: str, data: bytes, *, priority: int = 0, delay_s: float = 0.0,
                not_before: Any = None, key: str | None = None, coalesce: bool = False,
                unique_key: str | None = None, unique_for_s: float | None = None,
                unique_until_done: bool = False, create: bool = True,
                lease_s: float | None = None, depends_on: Iterable[int] = (),
                on_dependency_failure: str = "cancel") -> int:
        parents = [int(d) for d in depends_on]
        if unique_key is None and unique_for_s is None and create and lease_s is None \
                and not parents:
            return self.enqueue_many(queue, [data], priority=priority, delay_s=delay_s,
                                     not_before=not_before, key=key, coalesce=coalesce)[0]
        # a unique key is one shard's to hold: the shard of the key (or of the unique key);
        # dependencies are their shard's, and so is a job that waits for them
        k = self.shard_for(key or (unique_key if isinstance(unique_key, str) else None))
        if parents:
            shards = {self._shard_of(d) for d in parents}
            if len(shards) > 1:
                raise InvalidArgument("a job's dependencies must all be on one shard (enqueue "
                                      "them with one key)")
            k = shards.pop()
        item_id: int = self._shard(k).enqueue(
            queue, data, priority=priority, delay_s=delay_s, not_before=not_before, key=key,
            coalesce=coalesce, unique_key=unique_key, unique_for_s=unique_for_s,
            unique_until_done=unique_until_done, create=create, lease_s=lease_s,
            depends_on=parents, on_dependency_failure=on_dependency_failure)
        self.heard[k] = time.monotonic()
        return item_id

    def enqueue_many(self, queue: str, items: Iterable[bytes], *, priority: int = 0,
                     delay_s: float = 0.0, not_before: Any = None, key: str | None = None,
                     coalesce: bool = False) -> list[int]:
        """``Client.enqueue_many`` on one shard: the key's, or a random one."""
        k = self.shard_for(key) if key else self._live(self.shard_for(None))
        try:
            ids: list[int] = self._shard(k).enqueue_many(
                queue, items, priority=priority, delay_s=delay_s, not_before=not_before, key=key,
                coalesce=coalesce)
        except MasterUnavailable:
            self.picker.down[k] = time.monotonic() + DOWN_S  # keyless work goes elsewhere
            raise
        self.heard[k] = time.monotonic()
        return ids

    def _live(self, k: int) -> int:
        """Shard ``k`` if it answered lately, or answers a ``Hello`` within ``PROBE_S``; else
        another that does: a keyless enqueue must not wait on a dead shard (once its items
        are sent, an enqueue cannot move: whether they landed is not known)."""
        for _ in range(len(self.shards)):
            link = self.shards[k].master
            if time.monotonic() - self.heard.get(k, -QUIET_S) < QUIET_S:
                return k
            try:
                call(link.endpoint, p.Hello(), PROBE_S)
                self.heard[k] = time.monotonic()
                return k
            except ClientClosed:
                raise
            except (TimeoutError, BlizzardError):
                self.picker.down[k] = time.monotonic() + DOWN_S
                link.move_on(TimeoutError())  # with a standby: ask the other next time
            k = self.shard_for(None)
        return k

    def enqueue_task(self, queue: str, *, url: str, method: str = "POST",
                     headers: dict[str, str] | None = None, body: bytes | str = b"",
                     max_attempts: int = 5, backoff_s: float = 2.0, timeout_s: float = 10.0,
                     priority: int = 0, delay_s: float = 0.0, key: str | None = None) -> int:
        item_id: int = self._shard(self.shard_for(key)).enqueue_task(
            queue, url=url, method=method, headers=headers, body=body,
            max_attempts=max_attempts, backoff_s=backoff_s, timeout_s=timeout_s,
            priority=priority, delay_s=delay_s, key=key)
        return item_id

    def producer(self, queue: str, *, window: int = 4, **options: Any) -> ShardedProducer:
        """A producer whose batches go to the shards in turn (all to the key's, given one)."""
        return ShardedProducer(self, queue, window, options)

    def stage(self, queue: str, items: Iterable[bytes], *, priority: int = 0,
              delay_s: float = 0.0, key: str | None = None) -> Staged:
        staged: Staged = self._shard(self.shard_for(key)).stage(queue, items, priority=priority,
                                                                delay_s=delay_s, key=key)
        return staged

    def stager(self, queue: str, *, window: int = 8, chunk_items: int = 1000) -> ShardedStager:
        return ShardedStager(self, queue, window, chunk_items)

    def commit(self, staged: Staged) -> None:
        """Commit staged chunks, each on its shard (their ids say which)."""
        groups: dict[int, Staged] = {}
        for chunk in staged:
            if chunk[0]:
                groups.setdefault(self._shard_of(chunk[0][0]), []).append(chunk)
        for k, chunks in groups.items():
            self._shard(k).commit(chunks)

    # -- dequeue -----------------------------------------------------------------------------

    def dequeue(self, queue: str, *, lease_s: float | None = None,
                wait_s: float = 0.0) -> Message | None:
        msgs = self.dequeue_many(queue, 1, lease_s=lease_s, wait_s=wait_s)
        return msgs[0] if msgs else None

    def dequeue_many(self, queue: str, n: int, *, lease_s: float | None = None,
                     wait_s: float = 0.0, ack: Sequence[Message] = ()) -> list[Message]:
        """Lease up to ``n`` items from the best shard and read them (``Client.dequeue_many``)."""
        k, leased = self._lease(queue, n, lease_s, wait_s, ack)
        items = leased_items(leased)
        return self.shards[k].deliver(queue, items) if items else []

    def deliver(self, queue: str, items: list[LeasedItem]) -> list[Message]:
        """``Client.deliver`` on each item's shard, in the items' order; raises only if no
        item could be read (the first shard's error), as ``Client.deliver`` does."""
        msgs: list[Message] = []
        unreadable: BlizzardError | None = None
        for k, group in self._by_shard(items).items():
            try:
                msgs += self.shards[k].deliver(queue, group)
            except (DataCorrupt, DatanodeUnavailable, Forbidden) as exc:  # given back
                unreadable = unreadable or exc
        if unreadable is not None and not msgs:
            raise unreadable
        order = {item.id: n for n, item in enumerate(items)}
        return sorted(msgs, key=lambda m: order[m.id])

    def lease(self, queue: str, n: int, *, lease_s: float | None = None, wait_s: float = 0.0,
              ack: Sequence[Any] = ()) -> list[LeasedItem]:
        return leased_items(self._lease(queue, n, lease_s, wait_s, ack)[1])

    def lease_columns(self, queue: str, n: int, *, lease_s: float | None = None,
                      wait_s: float = 0.0) -> p.Leased:
        return self._lease(queue, n, lease_s, wait_s, ())[1]

    def _lease(self, queue: str, n: int, lease_s: float | None, wait_s: float,
               ack: Sequence[Any]) -> tuple[int, p.Leased]:
        """Lease from the shard the picker chooses. The previous batch's acks ride on that
        lease if they are all of the shard the picker prefers on a near tie; else they travel
        to their shards meanwhile (``blizzard/client/sharded/acks.py``)."""
        beside, prefer, riding = self.acks.start(ack)
        rode, leased = False, None
        try:
            k, leased, rode = self.picker.lease(queue, n, lease_s, wait_s, prefer, riding)
        finally:
            try:
                lost = self.acks.finish(beside, prefer, riding, rode)
            except BaseException:
                if leased is not None and leased.ids:  # the caller gets the error instead
                    self.shards[k].nack_ids(leased.ids, leased.leases, delay_s=0.0)
                raise
        if lost is not None:
            if leased.ids:  # the caller gets the error, so these go back at once
                self.shards[k].nack_ids(leased.ids, leased.leases, delay_s=0.0)
            raise lost
        return k, leased

    def fetch(self, items: list[LeasedItem]) -> tuple[dict[int, bytes], list[LeasedItem]]:
        payloads: dict[int, bytes] = {}
        failed: list[LeasedItem] = []
        for k, group in self._by_shard(items).items():
            got, bad = self.shards[k].fetch(group)
            payloads.update(got)
            failed += bad
        return payloads, failed

    def peek(self, queue: str, n: int = 1) -> list[Message]:
        """The best ``n`` head items over every shard (admin key), without leasing them."""
        msgs = [m for k in range(len(self.shards)) for m in self._shard(k).peek(queue, n)]
        return sorted(msgs, key=lambda m: (m.priority, m.enqueued_at))[:n]

    def consume(self, queue: str, n: int = 100, *, lease_s: float | None = None,
                wait_s: float = 1.0) -> Consumer:
        return Consumer(self, queue, n, lease_s, wait_s)

    def extend_many(self, msgs: Sequence[Any], *, lease_s: float,
                    progress: Mapping[int, tuple[float, str, bytes]] | None = None) -> list[int]:
        cancel: list[int] = []
        self._each(msgs, lambda shard, group: cancel.extend(
            shard.extend_many(group, lease_s=lease_s, progress=progress) or ()))
        return cancel

    # -- jobs: each shard answers for its own ids -------------------------------------------

    def jobs(self, ids: Sequence[int], *, wait_s: float = 0.0,
             read: bool = True) -> list[JobStatus]:
        until = time.monotonic() + wait_s
        found: dict[int, JobStatus] = {}
        for k, part in self._ids_by_shard(ids).items():
            left = max(0.0, until - time.monotonic())
            found.update((s.id, s) for s in self._shard(k).jobs(part, wait_s=left, read=read))
        return [found[i] for i in ids]

    def cancel(self, ids: Iterable[int]) -> list[int]:
        return [i for k, part in self._ids_by_shard(list(ids)).items()
                for i in self._shard(k).cancel(part)]

    def store_results(self, queue: str, jobs: Sequence[Any], blobs: Sequence[bytes], *,
                      kind: int = 0, ttl_s: float = 86400.0) -> list[int]:
        """Each result on its job's shard, whose master links them."""
        where: dict[int, list[int]] = {}
        for n, job in enumerate(jobs):
            where.setdefault(self._shard_of(job.id), []).append(n)
        made: dict[int, int] = {}
        for k, at in where.items():
            ids = self._shard(k).store_results(queue, [jobs[n] for n in at],
                                               [blobs[n] for n in at], kind=kind, ttl_s=ttl_s)
            made.update(zip(at, ids, strict=True))
        return [made[n] for n in range(len(jobs))]

    # -- schedules: each on the shard of its name --------------------------------------------

    def schedule(self, name: str, queue: str, payload: bytes, *, cron: str = "",
                 every_s: float = 0.0, timezone: str = "UTC", catch_up: bool = True,
                 overlap: bool = False) -> ScheduleStatus:
        status: ScheduleStatus = self._shard(self.shard_for(name)).schedule(
            name, queue, payload, cron=cron, every_s=every_s, timezone=timezone,
            catch_up=catch_up, overlap=overlap)
        return status

    def schedules(self, names: Sequence[str] = ()) -> list[ScheduleStatus]:
        found = [s for k in range(len(self.shards)) for s in self._shard(k).schedules(names)]
        return sorted(found, key=lambda s: s.name)

    def remove_schedule(self, name: str) -> bool:
        return any([self._shard(k).remove_schedule(name) for k in range(len(self.shards))])

    def _ids_by_shard(self, ids: Sequence[int]) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        for item_id in ids:
            groups.setdefault(self._shard_of(item_id), []).append(item_id)
        return groups

    def ack_many(self, msgs: Sequence[Any]) -> None:
        self._each(msgs, lambda shard, group: shard.ack_many(group))

    def nack_many(self, msgs: Sequence[Any], *, delay_s: float | None = None,
                  error: str = "") -> None:
        self._each(msgs, lambda shard, group: shard.nack_many(group, delay_s=delay_s, error=error))

    def _each(self, msgs: Sequence[Any], settle: Callable[[Any, list[Any]], None]) -> None:
        """Settle each shard's part; every part is tried (a shard down or a lease lost fails
        only its own), then the first such error raised."""
        failed: BlizzardError | None = None
        for k, group in self._by_shard(msgs).items():
            try:
                settle(self.shards[k], group)
            except (LeaseExpired, NotInQueue, UnknownItem, *UNAVAILABLE) as exc:
                failed = failed or exc
        if failed is not None:
            raise failed

    def ack_ids(self, ids: Sequence[int], leases: Sequence[int], queue: str = "") -> None:
        self.ack_many(_pairs(ids, leases, queue))

    def extend_ids(self, ids: Sequence[int], leases: Sequence[int], *, lease_s: float) -> None:
        self.extend_many(_pairs(ids, leases), lease_s=lease_s)

    def nack_ids(self, ids: Sequence[int], leases: Sequence[int], *,
                 delay_s: float | None = None, error: str = "") -> None:
        self.nack_many(_pairs(ids, leases), delay_s=delay_s, error=error)

    def suspected(self) -> list[str]:
        return sorted({node for shard in self.shards for node in shard.suspected()})

    # -- queues and the cluster --------------------------------------------------------------

    def stats(self, queue: str) -> dict[str, Any]:
        return merge_stats([shard.stats(queue) for shard in self.shards])

    def queue_config(self, queue: str) -> dict[str, Any]:
        return whole_settings(self.shards[0].queue_config(queue), len(self.shards))

    def create_queue(self, queue: str, **options: Any) -> dict[str, Any]:
        """Create ``queue`` on every shard that lacks it (those that have it keep their
        settings); ``QueueExists`` only if every shard had it."""
        part = shard_settings(options, len(self.shards))
        made = []
        for shard in self.shards:
            try:
                made.append(shard.create_queue(queue, **part))
            except QueueExists:
                pass
        if not made:
            raise QueueExists(f"queue {queue!r} exists on every shard")
        return whole_settings(made[0], len(self.shards))

    def configure_queue(self, queue: str, **options: Any) -> dict[str, Any]:
        part = shard_settings(options, len(self.shards))
        settings = [shard.configure_queue(queue, **part) for shard in self.shards]
        return whole_settings(settings[0], len(self.shards))

    def queues(self) -> list[dict[str, Any]]:
        return merge_queues(shard.queues() for shard in self.shards)

    def purge(self, queue: str) -> int:
        return sum(shard.purge(queue) for shard in self.shards)

    def redrive(self, queue: str, n: int = 10_000) -> int:
        done = 0
        for shard in self.shards:
            done += shard.redrive(queue, n - done) if done < n else 0
        return done

    def status(self) -> p.ClusterStatus:
        """The statuses of the shards that answer, merged (``statuses`` for each apart); those
        that did not, and why, are in ``unanswered``. ``MasterUnavailable`` if none answered."""
        answered = self._answering()
        if not answered:
            raise MasterUnavailable(f"none of the {len(self.shards)} shards' masters answered: "
                                    f"{self.unanswered[0]}")
        return merge_status([status for _, status in answered])

    def _answering(self) -> list[tuple[Any, p.ClusterStatus]]:
        """(shard, its status) of the shards that answer; the others, and why, in
        ``unanswered``."""
        answered, self.unanswered = [], {}
        for k, shard in enumerate(self.shards):
            try:
                answered.append((shard, shard.status()))
            except UNAVAILABLE as exc:
                self.unanswered[k] = f"{type(exc).__name__}: {exc}"
        return answered

    def statuses(self) -> list[p.ClusterStatus]:
        return [shard.status() for shard in self.shards]

    def delete(self, queue: str, item_id: int, *, force: bool = False) -> None:
        self.shards[self._shard_of(item_id)].delete(queue, item_id, force=force)

    def delete_queue(self, queue: str, *, force: bool = False) -> int:
        """Delete ``queue`` on every shard; ``UnknownQueue`` only if no shard had it."""
        count, found = 0, False
        for shard in self.shards:
            try:
                count += shard.delete_queue(queue, force=force)
                found = True
            except UnknownQueue:
                pass
        if not found:
            raise UnknownQueue(f"no shard has a queue {queue!r}")
        return count

    def remove_node(self, node_id: str) -> int:
        """Forget a dead data node of whichever shard it belongs to (of those that answer)."""
        for shard, status in self._answering():
            if any(node.node_id == node_id for node in status.nodes):
                removed: int = shard.remove_node(node_id)
                return removed
        raise InvalidArgument(f"no shard that answered knows a data node {node_id!r}")
