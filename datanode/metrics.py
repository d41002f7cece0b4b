"""A data node's Prometheus metrics: put/get/delete latency, LevelDB sync latency, items,
bytes, free disk, replication copies in flight, checksum failures.

Latencies are added up by the loop in plain Python (``Timing``); the rest is read when
``/metrics`` is scraped (in the HTTP server's thread: counters of the store, the number of
forwards waiting, ``shutil.disk_usage``), so an unscraped node pays nothing for them.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from time import perf_counter
from typing import Any

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from blizzard.server import metrics
from blizzard.server.metrics import Timing

OPS = ("put", "get", "delete", "push")  # push: a lease answered on the master's order


class DatanodeMetrics(metrics.ServedCollector):
    """A data node's registry: the loop's timings plus figures read from the node at scrape."""

    def __init__(self, server: Any) -> None:  # a DatanodeServer (which imports this module)
        self.server = server
        self.ops = {op: Timing() for op in OPS}
        self.sync = Timing()
        self.export(server.config)

    def since(self, op: str, began: float) -> None:
        """One ``op`` request answered; its loop pass took it up at ``began`` (``perf_counter``)."""
        self.ops[op].observe(perf_counter() - began)

    def wrote(self, puts: int, started: float, began: float) -> None:
        """A pass's synced batch is durable: it was begun at ``began``; its ``puts`` requests
        were taken up at ``started``."""
        done = perf_counter()
        self.sync.observe(done - began)
        put = self.ops["put"]
        for _ in range(puts):
            put.observe(done - started)

    def collect(self) -> Iterator[Metric]:
        server = self.server
        store = server.store
        yield metrics.histogram(
            "blizzard_datanode_request_duration_seconds",
            "Time to serve one request, by op: from its loop pass taking it up to its reply "
            "(a put: to its blobs being durable; forwards to replicas not included).",
            [((op,), self.ops[op]) for op in OPS], ["op"])
        yield metrics.histogram("blizzard_datanode_leveldb_sync_duration_seconds",
                                "Time of one synced LevelDB WriteBatch (all puts of a pass).",
                                [((), self.sync)])
        yield GaugeMetricFamily("blizzard_datanode_items", "Blobs stored.", value=store.count)
        yield metrics.frames()
        yield GaugeMetricFamily("blizzard_datanode_stored_bytes", "Payload bytes stored.",
                                value=store.bytes_used)
        yield GaugeMetricFamily("blizzard_datanode_free_disk_bytes",
                                "Free bytes on the data directory's file system.",
                                value=shutil.disk_usage(server.config.data_dir).free)
        yield GaugeMetricFamily("blizzard_datanode_replication_copies_in_flight",
                                "Copies sent to other data nodes (relays of puts, copies the "
                                "master ordered) not yet confirmed.",
                                value=len(server.replica_waits))
        yield CounterMetricFamily("blizzard_datanode_sync_holds",
                                  "Passes whose synced write was held for the puts on their "
                                  "way (--sync-hold-ms), while other producers were busy.",
                                  value=server.hold.holds)
        yield CounterMetricFamily("blizzard_datanode_checksum_failures",
                                  "Reads that found a stored blob failing its checksum.",
                                  value=getattr(store, "checksum_failures", 0))
