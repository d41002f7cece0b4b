"""A sharded queue's administration: each shard holds part of every queue, so counters add up.

``ShardedClient`` (``blizzard/client/sharded/client.py``) asks every shard and merges the answers
here. Settings go to every shard alike, except a rate limit: each shard admits its share of it
(``shard_settings``), so the queue as a whole keeps about the rate asked for while consumers spread
over the shards.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from blizzard.wire import protocol as p

SUMMED = ("ready", "delayed", "leased", "pending", "dead")


def merge_stats(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One queue's counters over the shards (``Client.stats``'s dicts): sums, and the oldest age."""
    merged = dict(parts[0])
    for key in SUMMED:
        merged[key] = sum(part[key] for part in parts)
    merged["oldest_age_s"] = max(part["oldest_age_s"] for part in parts)
    return merged


def merge_queues(lists: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every queue's counters over the shards, by name (a queue some shards lack counts 0 there)."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for listing in lists:
        for stats in listing:
            by_name.setdefault(stats["queue"], []).append(stats)
    return [merge_stats(by_name[name]) for name in sorted(by_name)]


def _merge_queue_stats(parts: list[p.QueueStats]) -> p.QueueStats:
    first = parts[0]
    sums = {key: sum(getattr(part, key) for part in parts)
            for key in (*SUMMED, "enqueued_total", "acked_total")}
    return p.replace(first, oldest_age_s=max(part.oldest_age_s for part in parts), **sums)


def merge_status(statuses: Sequence[p.ClusterStatus]) -> p.ClusterStatus:
    """The shards' statuses as one: every data node, each queue's counters summed; cluster
    ids and standbys joined in shard order, the highest epoch."""
    by_name: dict[str, list[p.QueueStats]] = {}
    for status in statuses:
        for queue in status.queues:
            by_name.setdefault(queue.queue, []).append(queue)
    first = statuses[0]
    return p.ClusterStatus(
        [node for status in statuses for node in status.nodes],
        [_merge_queue_stats(by_name[name]) for name in sorted(by_name)],
        sum(s.under_replicated for s in statuses), first.replication,
        all(s.secure for s in statuses), any(s.safe_mode for s in statuses),
        ",".join(s.cluster_id for s in statuses), max(s.epoch for s in statuses),
        ",".join(s.standby for s in statuses if s.standby),
        max(s.queues_more for s in statuses))


def shard_settings(options: dict[str, Any], shards: int) -> dict[str, Any]:
    """The settings one of ``shards`` shards gets: a rate limit (and its burst) split evenly."""
    options = dict(options)
    if options.get("rate_per_s"):
        options["rate_per_s"] = options["rate_per_s"] / shards
    if options.get("burst"):
        options["burst"] = max(1, math.ceil(options["burst"] / shards))
    return options


def whole_settings(settings: dict[str, Any], shards: int) -> dict[str, Any]:
    """A shard's settings as the queue's: its rate limit (and burst) times the shards."""
    settings = dict(settings)
    if settings.get("rate_per_s"):
        settings["rate_per_s"] = settings["rate_per_s"] * shards
    if settings.get("burst"):
        settings["burst"] = settings["burst"] * shards
    return settings
