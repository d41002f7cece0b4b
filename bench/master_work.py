"""What the masters did, counted rather than timed: requests handled, WAL group commits and
times the scheduler ran them, read from their ``/metrics`` and ``/proc``.

CPU time per item on a machine whose cores every process shares rises and falls with what
else runs (cache, preemption); these counts do not. Equal counts per item on two clusters say
their masters do the same work per item, so a CPU time that differs is the machine's
contention, not more work (``scripts/bench-pei --rate``).
"""

from __future__ import annotations

import os
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

REQUESTS = "blizzard_master_request_duration_seconds"
FSYNCS = "blizzard_master_wal_fsync_duration_seconds"


def masters_of(cluster: Any) -> list[Any]:
    """The ``LocalCluster`` of each shard (a plain cluster is its own one shard)."""
    return list(getattr(cluster, "shards", None) or [cluster])


def run_slices(pid: int) -> int:
    """How many times the scheduler has run any thread of ``pid`` (``schedstat``'s third
    field): one per wake-up of an event loop that sleeps in between."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[2])
    except (OSError, ValueError, IndexError):
        pass  # a thread that left meanwhile: counted without it
    return total


def counted(url: str) -> tuple[float, float]:
    """(requests handled, group commits) since the master started, from its ``/metrics``."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode("utf-8")
    requests = fsyncs = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == REQUESTS + "_count" and sample.labels.get("op") != "Heartbeat":
                requests += sample.value
            elif sample.name == FSYNCS + "_count":
                fsyncs += sample.value
    return requests, fsyncs


def master_work(cluster: Any) -> dict[str, float]:
    """The masters' requests (data nodes' heartbeats left out: they come by the clock, not by
    the load), group commits and scheduler runs so far, summed over the shards; the clusters
    must serve metrics (``metrics=True``)."""
    total = {"requests": 0.0, "fsyncs": 0.0, "runs": 0.0}
    for shard in masters_of(cluster):
        requests, fsyncs = counted(shard.metrics_url("master"))
        total["requests"] += requests
        total["fsyncs"] += fsyncs
        total["runs"] += run_slices(shard.master.popen.pid)
    return total

