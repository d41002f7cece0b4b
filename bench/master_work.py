"""What the masters did, counted rather than timed: requests handled, WAL group commits,
wake-ups and preemptions of their threads, read from their ``/metrics`` and ``/proc``.

CPU time per item on a machine whose cores every process shares rises and falls with what
else runs (cache, preemption); requests and group commits do not, so equal counts per item on
two clusters say their masters do the same work per item. Wake-ups tell how the requests came
(many to a pass, or one each); preemptions rise with the machine's load
(``scripts/bench-pei --rate``).
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


def switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of every thread of ``pid`` so far: a thread
    that sleeps and is woken (an event loop waiting for a request, a blocking fsync), and one
    that is preempted while it could run on (which rises with the machine's load)."""
    woken = preempted = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0, 0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        woken += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        preempted += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue  # a thread that left meanwhile: counted without it
    return woken, preempted


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
    the load), group commits, wake-ups and preemptions so far, summed over the shards; the
    clusters must serve metrics (``metrics=True``)."""
    total = {"requests": 0.0, "fsyncs": 0.0, "wakeups": 0.0, "preempted": 0.0}
    for shard in masters_of(cluster):
        requests, fsyncs = counted(shard.metrics_url("master"))
        woken, preempted = switches(shard.master.popen.pid)
        total["requests"] += requests
        total["fsyncs"] += fsyncs
        total["wakeups"] += woken
        total["preempted"] += preempted
    return total
