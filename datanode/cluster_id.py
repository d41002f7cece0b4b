"""The cluster a data node belongs to: adopted from the first master it reaches, then kept.

The id lives in the node's store (so it goes wherever its blobs go) and rides on every
heartbeat. A reply from a master of another cluster is not obeyed: no deletes, no copies, no
capability keys, no inventory. The node does not exit either. It goes on heartbeating and logs
the mismatch once, so fixing the address or starting the right master is all it takes,
and a supervisor that restarts exiting processes does not spin on it.

A node from before cluster ids that holds blobs is refused by a master that has never seen
it (see ``master/nodes/cluster_id.py``); ``--join-cluster ID`` is the operator's word that it
belongs to cluster ``ID``: the id is kept in the store at start, before any heartbeat.
"""

from __future__ import annotations

import logging
from typing import Any

from blizzard.wire import protocol as p
from blizzard.wire.errors import AuthenticationFailed, Forbidden, ForeignCluster, InvalidArgument
from datanode.store import BlobStore

log = logging.getLogger(__name__)

META_KEY = "cluster_id"


class ClusterMembership:
    """This node's cluster id, and the check every heartbeat reply passes before it is obeyed."""

    def __init__(self, store: BlobStore, join: str = "") -> None:
        self.store = store
        raw = store.get_meta(META_KEY)
        self.cluster_id = raw.decode() if raw else ""  # "": a fresh node (or one from before ids)
        self.refusal = ""  # the complaint logged last, so it is logged once
        if join:
            self._join(join)

    def _join(self, cluster_id: str) -> None:
        """The operator says this node is of ``cluster_id``: kept, unless it is of another."""
        if self.cluster_id and self.cluster_id != cluster_id:
            raise InvalidArgument(f"this node belongs to cluster {self.cluster_id}; it cannot "
                                  f"join cluster {cluster_id} (drop --join-cluster)")
        if not self.cluster_id:
            self.store.put_meta(META_KEY, cluster_id.encode())
            self.cluster_id = cluster_id
            log.info("joined cluster %s as told (--join-cluster)", cluster_id)

    def accepts(self, reply: Any) -> bool:
        """True if ``reply`` (to a heartbeat) comes from this node's cluster; a fresh node
        adopts the id it carries, durably, before obeying anything."""
        if isinstance(reply, p.Error):
            if reply.code in (ForeignCluster.code, Forbidden.code, AuthenticationFailed.code):
                self._refuse(f"the master refuses this node: {reply.message}")
            return False
        if not isinstance(reply, p.HeartbeatReply):
            return False
        if not reply.cluster_id:
            self._refuse("the master sent no cluster id (a master older than cluster ids?)")
            return False
        if not self.cluster_id:
            self.store.put_meta(META_KEY, reply.cluster_id.encode())
            self.cluster_id = reply.cluster_id
            log.info("joined cluster %s", self.cluster_id)
        elif reply.cluster_id != self.cluster_id:
            self._refuse(f"the master at this address is of cluster {reply.cluster_id[:64]}, "
                         f"this node belongs to cluster {self.cluster_id}: not obeying it "
                         "(is --master the right one?)")
            return False
        if self.refusal:
            log.info("the master is of this node's cluster %s again", self.cluster_id)
            self.refusal = ""
        return True

    def _refuse(self, why: str) -> None:
        if why != self.refusal:
            log.error("%s", why)
            self.refusal = why
