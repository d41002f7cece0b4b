"""How the state applies the items a rebuild from the data nodes made (``RebuildItems``).

Part of the pure state machine (``State.apply`` dispatches the record here), kept apart so
each file stays short: like every apply, it touches no socket, file or clock.
"""

from __future__ import annotations

from typing import Any

from master.item import DELAYED, READY, Item
from master.records import RebuildItems


def apply_rebuild_items(state: Any, rec: RebuildItems) -> None:
    """Each item enters its queue in line (by priority, then id), ready or delayed, with its
    attempts; an id the state holds already is left as it is."""
    q = state.queue(rec.queue)
    nodes = state.replica_set(rec.nodes)
    for k, item_id in enumerate(rec.ids):
        if item_id in state.items:
            continue
        not_before = rec.not_befores[k]
        item = Item(rec.priorities[k], item_id, item_id, q.name, rec.sizes[k], rec.crcs[k],
                    rec.keys[k], nodes, rec.at, rec.attempts[k],
                    DELAYED if not_before > 0 else READY)
        state._enter(q, item, not_before)
        if rec.origins[k]:
            state.origins[item_id] = rec.origins[k]
        state.id_hi = max(state.id_hi, item_id + 1)


APPLY = {RebuildItems: apply_rebuild_items}
