"""Queue administration and inspection from the client's side, over the master link."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from blizzard.client.master_link import MasterLink
from blizzard.client.message import LeasedItem, leased_items
from blizzard.wire import protocol as p
from blizzard.wire import queue_settings
from blizzard.wire.codec import as_ids
from blizzard.wire.queue_settings import check_queue_name


class QueueAdmin:
    """Settings, counters, purge and redrive of named queues; the cluster's status."""

    def __init__(self, master: MasterLink) -> None:
        self.master = master

    def stats(self, queue: str) -> dict[str, Any]:
        return stats_dict(self.master.call(p.Stats(check_queue_name(queue))))

    def describe(self, queue: str) -> p.QueueStats:
        """A queue's counters, settings and whether the master holds it, in one reply."""
        reply: p.QueueStats = self.master.call(p.Stats(check_queue_name(queue)))
        return reply

    def queue_config(self, queue: str) -> dict[str, Any]:
        return p.as_dict(self.master.call(p.Stats(check_queue_name(queue))).settings)

    def configure(self, queue: str, create: bool, options: dict[str, Any]) -> dict[str, Any]:
        """Create (``create``) or change a queue with ``options``; all its settings after.

        The options are checked here first (``queue_settings.check_changes``), so a bad one
        is refused with ``InvalidArgument`` before anything is sent.
        """
        changes = queue_settings.check_changes(options)
        settings = {name: changes.get(name) for name in queue_settings.NAMES}
        reply = self.master.call(p.Configure(check_queue_name(queue), create, **settings))
        return p.as_dict(reply.settings)

    def queues(self) -> list[dict[str, Any]]:
        """Every queue's counters, by name, a page (``MAX_QUEUE_PAGE`` queues) a round trip."""
        return [stats_dict(q) for q in self.describe_all()]

    def describe_all(self) -> list[p.QueueStats]:
        """Every queue's counters and settings, by name, a page a round trip."""
        out: list[p.QueueStats] = []
        after = ""
        while True:  # each page starts past the last one, so this ends
            page = self.master.call(p.ListQueues(after))
            out += page.queues
            if not page.more or not page.queues:
                return out
            after = page.queues[-1].queue

    def purge(self, queue: str) -> int:
        reply: p.Acked = self.master.call(p.Purge(check_queue_name(queue)))
        return reply.done

    def redrive(self, queue: str, n: int, ids: Sequence[int] = ()) -> int:
        """Dead items of ``queue`` back home (``ids``: only these; a delayed one of them in
        ``queue`` is made ready now); how many."""
        reply: p.Acked = self.master.call(p.Redrive(check_queue_name(queue), n, as_ids(list(ids))))
        return reply.done

    def peek_items(self, queue: str, n: int = 1, *, ids: Sequence[int] = (),
                   delayed: bool = False) -> list[LeasedItem]:
        """Items of ``queue`` without leasing them: the head, ``ids`` (those in the queue), or
        the delayed ones due first (``delayed``); read them with ``Client.fetch``."""
        return leased_items(self.master.call(p.Peek(check_queue_name(queue), n,
                                                    as_ids(list(ids)), delayed)))

    def status(self) -> p.ClusterStatus:
        status: p.ClusterStatus = self.master.call(p.Status())
        return status

    def delete_item(self, queue: str, item_id: int, force: bool) -> None:
        self.master.call(p.DeleteItem(check_queue_name(queue), p.Id(item_id), force))

    def delete_queue(self, queue: str, force: bool) -> int:
        reply: p.Removed = self.master.call(p.DeleteQueue(check_queue_name(queue), force))
        return reply.count

    def remove_node(self, node_id: str) -> int:
        reply: p.Removed = self.master.call(p.RemoveNode(node_id))
        return reply.count


def stats_dict(s: p.QueueStats) -> dict[str, Any]:
    return {"queue": s.queue, "ready": s.ready, "delayed": s.delayed, "leased": s.leased,
            "pending": s.pending, "dead": s.dead, "oldest_age_s": s.oldest_age_s}
