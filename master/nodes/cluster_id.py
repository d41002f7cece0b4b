"""The cluster's identity: made once, kept in the WAL, checked on every data node's heartbeat.

Two clusters on one machine (or a data node pointed at the wrong master) must not mix: a node
of one cluster joining another would be counted there as a replica holder and stay "dead" for
good once it left. So the master makes a random id at its first start (``ClusterCreated``,
kept in the WAL and in every checkpoint; a data dir from before cluster ids gets one on its
next start), every data node keeps the id of the first master it reached in its store and
sends it with each heartbeat, and each side refuses the other's cluster.

A node with no id yet adopts the master's only while it holds nothing, or while the master
knows it already (a cluster from before ids, upgraded): a node from before ids that holds
blobs and is new to this master most likely reached the wrong master, or one that lost its
data dir, and would have every blob ordered deleted as a stray. Such a node is refused until
the operator vouches for it (``datanode --join-cluster ID``).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import Any

from blizzard.wire import protocol as p
from blizzard.wire.errors import ForeignCluster
from master.state.machine import State
from master.state.records import ClusterCreated

log = logging.getLogger(__name__)

MAX_REFUSED_LOGGED = 1024  # foreign nodes remembered so each is logged once


def new_cluster_id() -> str:
    """16 random hex characters: two clusters never draw the same one in practice."""
    return secrets.token_hex(8)


class ClusterIdentity:
    """The master's cluster id, and the gate every heartbeat passes before it registers a node."""

    def __init__(self, state: State, log_record: Callable[[Any], None]) -> None:
        self.state = state
        self.refused: set[tuple[str, str]] = set()  # (node id, its cluster id) logged already
        made = not state.cluster_id  # a first start, or a data dir from before cluster ids
        if made:
            log_record(ClusterCreated(new_cluster_id()))
        log.info("cluster id %s%s", state.cluster_id, " (new)" if made else "")

    @property
    def cluster_id(self) -> str:
        return self.state.cluster_id

    def admit(self, msg: p.Heartbeat) -> None:
        """A node of this cluster (or a fresh one, which adopts this id with the heartbeat's
        reply) passes; a node of another cluster gets ``ForeignCluster``, before it is
        registered."""
        if msg.cluster_id and msg.cluster_id != self.cluster_id:
            self._log_refusal(msg.node_id[:64], msg.cluster_id[:64])
            raise ForeignCluster(
                f"this master is of cluster {self.cluster_id}; data node {msg.node_id[:64]} "
                f"belongs to cluster {msg.cluster_id[:64]} (is its --master the right one?)")
        if not msg.cluster_id and msg.items > 0 and msg.node_id not in self.state.node_addrs:
            self._log_refusal(msg.node_id[:64], "")
            raise ForeignCluster(
                f"data node {msg.node_id[:64]} holds {msg.items} blobs and no cluster id, and "
                f"this master (cluster {self.cluster_id}) has never seen it: is its --master "
                "the right one, and did this master keep its data dir? To attach the node "
                f"anyway (its blobs that no item here names get deleted), restart it with "
                f"--join-cluster {self.cluster_id}")

    def _log_refusal(self, node_id: str, cluster_id: str) -> None:
        """Once per node and foreign id: a refused node heartbeats every second."""
        if (node_id, cluster_id) in self.refused or len(self.refused) >= MAX_REFUSED_LOGGED:
            return
        self.refused.add((node_id, cluster_id))
        if cluster_id:
            log.error("refusing data node %s of another cluster (%s; this is %s): it is not "
                      "registered", node_id, cluster_id, self.cluster_id)
        else:
            log.error("refusing data node %s: it holds blobs, has no cluster id and is new "
                      "to this master; to attach it, restart it with --join-cluster %s",
                      node_id, self.cluster_id)
