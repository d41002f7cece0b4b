"""How the state applies the records of cluster identity, high availability and operator
removals.

Part of the pure state machine (``State.apply`` dispatches these records here), kept apart so
each file stays short: like every apply, these touch no socket, file or clock.
"""

from __future__ import annotations

from typing import Any

from master.records import (ClusterCreated, DeleteItems, DeleteQueue, EpochBegun, ForgetNode,
                            StandbySynced)


def apply_cluster_created(state: Any, rec: ClusterCreated) -> None:
    """The first id a master made is its cluster's for good."""
    state.cluster_id = state.cluster_id or rec.cluster_id


def apply_epoch_begun(state: Any, rec: EpochBegun) -> None:
    """A promotion: the epoch rises and no standby is in sync with the new primary yet."""
    state.epoch = max(state.epoch, rec.epoch)
    state.standby = ("", "")


def apply_standby_synced(state: Any, rec: StandbySynced) -> None:
    state.standby = (rec.name, rec.addr)


def apply_forget_node(state: Any, rec: ForgetNode) -> None:
    """The node is no replica of anything any more; its address is forgotten too."""
    state.node_addrs.pop(rec.node_id, None)
    state.node_keys.pop(rec.node_id, None)  # its key may speak for a new node id now
    for item in [i for i in state.items.values() if rec.node_id in i.nodes]:
        state.set_nodes(item, tuple(n for n in item.nodes if n != rec.node_id))


def apply_delete_items(state: Any, rec: DeleteItems) -> None:
    for item_id in rec.ids:
        item = state.items.get(item_id)
        if item is not None:
            state.forget(item)


def apply_delete_queue(state: Any, rec: DeleteQueue) -> None:
    """Every item still in the queue goes, then the queue with its settings."""
    for item in [i for i in state.items.values() if i.queue == rec.queue]:
        state.forget(item)
    state.queues.pop(rec.queue, None)


APPLY = {ClusterCreated: apply_cluster_created, ForgetNode: apply_forget_node,
         DeleteItems: apply_delete_items, DeleteQueue: apply_delete_queue,
         EpochBegun: apply_epoch_begun, StandbySynced: apply_standby_synced}
