"""Item metadata changes sent to the data nodes that hold the items, on heartbeat replies.

A data node keeps each item's metadata beside its blob (``datanode/meta.py``), as the producer
put it: queue, priority, not-before, key, 0 attempts. What the master changes later is sent
along here, best effort: an item given back (a nack or an expired lease: attempts + 1, maybe a
delay), moved to its dead-letter queue (with its origin), redriven home (attempts 0), or woken
(delayed no more). A new
replica that got a changed item's copy is told again, in case the copy carried older metadata.
A rebuild from the nodes (``master/ha/rebuild.py``) then puts such items where they were; an
update still waiting here when the master's disk is lost is lost with it (the item comes back
with fewer attempts, or in its origin queue).

The change is noted when its record is logged and the item's metadata is read when a node's
heartbeat is answered, so several changes to one item send it once. Bounded per node: past
``MAX_WAITING`` ids, more are dropped (counted in ``dropped``).
"""

from __future__ import annotations

import logging
from itertools import islice
from typing import Any

from blizzard.wire import protocol as p
from master.state.machine import State
from master.state.records import (
    AddReplicas,
    BuryItems,
    RearmItems,
    RedriveItems,
    ReleaseItems,
    WakeItems,
)

log = logging.getLogger(__name__)

MAX_WAITING = 200_000  # ids with changes waiting for one node
MAX_PER_REPLY = 2_000  # ids whose metadata one heartbeat reply carries
CHANGES = (ReleaseItems, BuryItems, RedriveItems, WakeItems, RearmItems)


class MetaSync:
    """Ids whose metadata changed, per data node holding them, until its next heartbeat."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.waiting: dict[str, dict[int, None]] = {}  # node id -> ids (an ordered set)
        self.dropped = 0

    def saw(self, rec: Any) -> None:
        """Note the items a logged record changed (called after it is applied)."""
        kind = type(rec)
        if kind in CHANGES:
            items = self.state.items
            for item_id in rec.ids:
                item = items.get(item_id)
                if item is not None:
                    for node in item.nodes:
                        self._note(node, item_id)
        elif kind is AddReplicas:
            state = self.state
            for item_id in rec.ids:
                item = state.items.get(item_id)
                if item is not None and (item.attempts or item_id in state.delays):
                    self._note(rec.node, item_id)

    def _note(self, node: str, item_id: int) -> None:
        ids = self.waiting.setdefault(node, {})
        if len(ids) < MAX_WAITING:
            ids[item_id] = None
        elif item_id not in ids:
            if not self.dropped:
                log.warning("over %d metadata changes wait for data node %s; dropping more "
                            "(a rebuild may then find older metadata)", MAX_WAITING, node)
            self.dropped += 1

    def take(self, node: str) -> list[p.ItemMeta]:
        """The current metadata of up to ``MAX_PER_REPLY`` changed items ``node`` holds, in
        groups of equal metadata; items gone since (acked, deleted) are skipped."""
        ids = self.waiting.get(node)
        if not ids:
            return []
        taken = list(islice(ids, MAX_PER_REPLY))
        for item_id in taken:
            del ids[item_id]
        if not ids:
            del self.waiting[node]
        state = self.state
        groups: dict[tuple, list[int]] = {}
        for item_id in taken:
            item = state.items.get(item_id)
            if item is not None and node in item.nodes:
                same = (item.queue, item.priority, state.delays.get(item_id, 0.0), item.key,
                        item.attempts, state.origins.get(item_id, ""))
                groups.setdefault(same, []).append(item_id)
        return [p.ItemMeta(ids, *same) for same, ids in groups.items()]

    def add_to(self, reply: p.HeartbeatReply, node: str) -> p.HeartbeatReply:
        """``reply`` (to ``node``'s heartbeat) with the node's waiting changes."""
        changes = self.take(node)
        return p.replace(reply, meta=changes) if changes else reply
