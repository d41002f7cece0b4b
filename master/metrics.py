"""The master's Prometheus metrics: per-queue depths and totals, request and WAL latencies,
checkpoints, items, data nodes, under-replication, safe mode.

Latencies and the WAL's bytes are added up by the loop in plain Python (``Timing``); every
other figure is read from the master's state when ``/metrics`` is scraped, so an unscraped
master pays nothing for them. The scrape runs in the HTTP server's thread while the loop
mutates that state: it only reads (never ``promote_due`` or anything else that writes),
copies a dictionary's items in one C call before walking them, and retries a scan that a
dictionary changing size interrupted. Figures may thus be a few requests apart from each
other; each is one the master had. A delayed item whose time has come counts as delayed
until its queue is next served (a lease, a peek or stats promote it).

Per-queue series name the first ``--metrics-queues`` queues by name (``MasterConfig.
metrics_queues``, 100) and sum the rest in one series labelled ``queue="(other)"``, so a
scrape of a master holding 10,000 queues is about as big as one of 100 (each named queue adds
about 1.5 KB); ``blizzard/server/metrics.py`` renders it at most every ``RENDER_EVERY_S``.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from blizzard.server import metrics
from blizzard.server.metrics import Timing
from blizzard.server.sync_hold import SyncHold
from master.config import MasterConfig
from master.consume.leases import LOST_NAMES, Leases
from master.consume.pushes import Pushes
from master.log.wal import MemoryWal, Wal
from master.nodes.membership import Membership
from master.nodes.repair import Repairer
from master.nodes.safe_mode import SafeMode
from master.produce.enqueue import Enqueues
from master.shard.heads import Heads
from master.state.counts import KINDS, QueueCounts
from master.state.item import Item, QueueState
from master.state.machine import State

log = logging.getLogger(__name__)

T = TypeVar("T")

HEAD_SCAN = 64  # entries of each part of a ready line a scrape looks at for the head item
# The label of the queues past the first ``metrics_queues`` (by name), their figures summed: a
# scrape's size and cost stay bounded however many queues there are (not a queue name: no
# queue name has parentheses)
OTHER = "(other)"

QUEUE_DEPTHS = (  # (metric, help)
    ("blizzard_queue_ready_items", "Items a lease could take now."),
    ("blizzard_queue_delayed_items", "Items waiting for their not-before time (delay, back-off)."),
    ("blizzard_queue_leased_items", "Items leased to consumers, not yet settled."),
    ("blizzard_queue_pending_items", "Items staged and not yet committed."),
    ("blizzard_queue_dead_items", "Items in this queue's dead-letter queue."),
)
TOTAL_HELP = {
    "enqueued": "Items enqueued (made visible) since the master started.",
    "leased": "Items leased (deliveries) since the master started.",
    "acked": "Items acked since the master started.",
    "nacked": "Items given back by a nack since the master started.",
    "expired": "Leases that ran out since the master started.",
    "dead_lettered": "Items moved to the dead-letter queue since the master started.",
}


def _retrying(read: Callable[[], T], tries: int = 5) -> T | None:
    """``read()``, again if the loop changed a dictionary's size under it; None if it kept on."""
    for _ in range(tries):
        try:
            return read()
        except RuntimeError:  # "dictionary changed size during iteration"
            continue
    return None


class MasterMetrics(metrics.ServedCollector):
    """The master's registry: the loop's timings plus figures read from its state at scrape."""

    def __init__(self, config: MasterConfig, state: State, wal: Wal | MemoryWal, *,
                 counts: QueueCounts, enqueues: Enqueues, leases: Leases, heads: Heads,
                 membership: Membership, repair: Repairer, safe_mode: SafeMode,
                 pushes: Pushes, hold: SyncHold) -> None:
        """What it reads at a scrape: the state and the handlers' own figures."""
        self.config, self.state = config, state
        self.counts, self.enqueues, self.leases, self.heads = counts, enqueues, leases, heads
        self.membership, self.repair, self.safe_mode = membership, repair, safe_mode
        self.pushes, self.hold = pushes, hold
        self.requests: dict[type, Timing] = {}
        self.wal_sync = Timing()
        self.wal_bytes = 0
        self.checkpoints = 0
        self.checkpoint_s = 0.0  # the last one's duration
        self.export(config)
        wal.on_sync = self.wal_synced

    # -- fed by the loop ---------------------------------------------------------------------

    def request(self, kind: type, seconds: float) -> None:
        timing = self.requests.get(kind)
        if timing is None:
            timing = self.requests[kind] = Timing()
        timing.observe(seconds)

    def wal_synced(self, seconds: float, nbytes: int) -> None:
        self.wal_sync.observe(seconds)
        self.wal_bytes += nbytes

    def checkpointed(self, seconds: float) -> None:
        self.checkpoints += 1
        self.checkpoint_s = seconds

    # -- read at scrape ----------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        yield from self._queues()
        yield from self._master()

    def _queues(self) -> Iterator[Metric]:
        state = self.state
        queues = _retrying(lambda: list(state.queues.items())) or []
        named = set(heapq.nsmallest(self.config.metrics_queues, (name for name, _ in queues)))
        staged = dict(self.enqueues.by_queue)
        depths = [GaugeMetricFamily(name, doc, labels=["queue"]) for name, doc in QUEUE_DEPTHS]
        oldest = GaugeMetricFamily("blizzard_queue_oldest_ready_age_seconds",
                                   "Age of the item at the head of the queue (0: none ready; "
                                   f"not told for {OTHER}).", labels=["queue"])
        now = time.time()
        others = [0] * len(QUEUE_DEPTHS)
        for name, q in queues:
            dead_q = state.queues.get(q.config.dead_letter_queue(name))
            dead = dead_q.n_ready + dead_q.n_delayed + dead_q.n_leased if dead_q else 0
            values = (q.n_ready, q.n_delayed, q.n_leased, staged.get(name, 0), dead)
            if name not in named:
                others = [total + value for total, value in zip(others, values, strict=True)]
                continue
            for family, value in zip(depths, values, strict=True):
                family.add_metric([name], value)
            oldest.add_metric([name], self._head_age(q, now) if q.n_ready else 0.0)
        if len(queues) > len(named):
            for family, value in zip(depths, others, strict=True):
                family.add_metric([OTHER], value)
        yield from depths
        yield oldest
        counts = self.counts
        for kind in KINDS:
            totals = CounterMetricFamily(f"blizzard_queue_{kind}", TOTAL_HELP[kind],
                                         labels=["queue"])
            other = None  # (deleted queues' totals count here too)
            for name, n in sorted(dict(counts.by_kind[kind]).items()):
                if name in named:
                    totals.add_metric([name], n)
                else:
                    other = (other or 0) + n
            if other is not None:
                totals.add_metric([OTHER], other)
            yield totals
        refused = CounterMetricFamily(
            "blizzard_acks_refused", "Items of quiet acks (``Message.ack()``) the master could not "
            "settle since it started, by reason: a consumer acking ids it does not hold.",
            labels=["reason"])
        seen = dict(counts.refused_acks)
        for why, name in sorted(LOST_NAMES.items()):  # each reason from 0: an alert has a series
            refused.add_metric([name.replace(" ", "_")], seen.get(why, 0))
        yield refused

    def _head_age(self, q: QueueState, now: float) -> float:
        """Seconds since the head item of ``q``'s ready line was enqueued.

        The line keeps records that changed since (leased, dead-lettered, replaced) until the
        loop pops them, and only the loop may: the first current one near the front stands in.
        """
        items = self.state.items
        front: list[Item] = q.ready.near_front(HEAD_SCAN)  # (ReadyLine's records are Any)
        live = [entry for entry in front if items.get(entry.id) is entry]
        return max(0.0, now - min(live).enqueued_at) if live else 0.0

    def _master(self) -> Iterator[Metric]:
        yield metrics.histogram(
            "blizzard_master_request_duration_seconds",
            "Time the master's loop spent handling one request, by op (to the reply, "
            "without the pass's fsync).",
            sorted(((kind.__name__,), t) for kind, t in list(self.requests.items())), ["op"])
        yield metrics.histogram("blizzard_master_wal_fsync_duration_seconds",
                                "Time of one group commit: the WAL write and its fdatasync.",
                                [((), self.wal_sync)])
        yield CounterMetricFamily("blizzard_master_wal_written_bytes",
                                  "Bytes written to the WAL.", value=self.wal_bytes)
        yield CounterMetricFamily("blizzard_master_checkpoints", "Checkpoints written.",
                                  value=self.checkpoints)
        yield GaugeMetricFamily("blizzard_master_checkpoint_duration_seconds",
                                "The last checkpoint's duration, from fork to the child reaped.",
                                value=self.checkpoint_s)
        yield GaugeMetricFamily("blizzard_master_items", "Items the master holds in memory.",
                                value=len(self.state.items))
        yield GaugeMetricFamily("blizzard_master_long_polls",
                                "Lease requests parked until items come (long polls).",
                                value=len(self.leases.waiters))
        listened = self.heads.listened  # master/shard/subscribers.py
        yield GaugeMetricFamily("blizzard_heads_subscriptions",
                                "Subscriptions the heads feed applies, all connections "
                                "together (a topic once per connection listening).",
                                value=listened.count)
        yield CounterMetricFamily("blizzard_heads_subscriptions_refused",
                                  "Heads feed subscriptions refused (over a cap, or no queue's "
                                  "topic) since the master started.", value=listened.refused)
        yield CounterMetricFamily("blizzard_heads_subscribers_cut",
                                  "Heads feed connections cut for asking more than their share "
                                  "or for no queue's topic.", value=listened.cut)
        mono = time.monotonic()
        members = self.membership
        nodes = _retrying(lambda: list(members.nodes.values())) or []
        alive = sum(1 for n in nodes if members.is_alive(n, mono))
        suspect = sum(1 for n in nodes if members.is_alive(n, mono) and members.is_suspect(n, mono))
        family = GaugeMetricFamily("blizzard_datanodes", "Known data nodes: alive and healthy, "
                                   "alive but suspect (silent a few heartbeats: placed only if "
                                   "need be, read from last), dead.", labels=["state"])
        family.add_metric(["alive"], alive - suspect)
        family.add_metric(["suspect"], suspect)
        family.add_metric(["dead"], len(nodes) - alive)
        yield family
        yield metrics.frames()
        yield CounterMetricFamily("blizzard_master_sync_holds",
                                  "Passes whose WAL fsync was held for the requests on their "
                                  "way (--sync-hold-ms), while other clients were busy.",
                                  value=self.hold.holds)
        yield CounterMetricFamily("blizzard_write_hedges",
                                  "Enqueues whose placed data nodes had not all stored the items "
                                  "within the hedge delay, so the master named other nodes to "
                                  "put them on as well (PutAlso).", value=self.enqueues.hedged)
        pushed = CounterMetricFamily(
            "blizzard_pushed_leases", "Leases a data node was ordered to answer, payloads and "
            "all (master/consume/pushes.py), by who answered: the node, or the master when the "
            "node could not or was late.", labels=["by"])
        pushed.add_metric(["node"], self.pushes.pushed)
        pushed.add_metric(["master"], self.pushes.direct)
        yield pushed
        under = _retrying(lambda: self.repair.under_replicated(mono))
        if under is not None:
            yield GaugeMetricFamily("blizzard_under_replicated_items",
                                    "Items with fewer live replicas than the replication factor.",
                                    value=under)
        yield GaugeMetricFamily("blizzard_safe_mode",
                                "1 while the master is in safe mode after a start, else 0.",
                                value=1 if self.safe_mode.on else 0)
        yield GaugeMetricFamily("blizzard_master_replication_factor",
                                "Copies of each item the master keeps (R).",
                                value=self.config.replication)

