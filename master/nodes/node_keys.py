"""Which data node key speaks for which node id: bound at the first heartbeat, kept in the WAL.

Every data node has a key of its own (``blizzard keys add-node DIR NAME``). The first
heartbeat under a key binds it to the node id that heartbeat names (``NodeKeyBound``: a
restarted or promoted master remembers). From then on:

- a heartbeat naming a node id bound to another key is refused while that key is in the key
  directory: one node's key cannot pose as another node. Once the operator revoked that key
  (``blizzard keys remove-node``), a new key may take the id over;
- a key speaks for one node id: a heartbeat naming another id is refused while the node the
  key is bound to is alive, so an invented id gets no capability key ring. A node whose disk
  was wiped comes back under a new id with its old key once the old id is dead, and the
  binding moves (``blizzard node remove`` of the old id frees it at once).

The heartbeat reply is the only way to the key ring, so the ring goes to bound nodes only;
and a node reports (puts, copies, inventories) on its own node id only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from blizzard.wire.errors import Forbidden
from master.state.machine import State
from master.state.records import NodeKeyBound

log = logging.getLogger(__name__)


class NodeKeys:
    """The check of a heartbeat's node id against the key its connection authenticated with."""

    def __init__(self, state: State, log_record: Callable[[Any], None],
                 key_of: Callable[[bytes], str], revoked: Callable[[str], bool],
                 alive: Callable[[str, float], bool]) -> None:
        self.state = state
        self.log = log_record
        self.key_of = key_of  # a peer's public key, z85 ("": security off)
        self.revoked = revoked  # True once a key is no data node key in the key directory
        self.alive = alive  # (node id, monotonic now) -> is that node alive

    def check(self, node_id: str, peer: bytes, mono: float) -> None:
        """``Forbidden`` unless the peer's key may speak for ``node_id`` (binding it if new)."""
        key = self.key_of(peer)
        if not key:
            return
        bound = self.state.node_keys.get(node_id)
        if bound == key:
            return
        if bound is not None and not self.revoked(bound):
            raise Forbidden(f"data node {node_id[:64]} speaks with another key; this key cannot "
                            "claim its id (revoke that key with `blizzard keys remove-node` "
                            "to move the id)")
        held = next((n for n, k in self.state.node_keys.items() if k == key), None)
        if held is not None and self.alive(held, mono):
            raise Forbidden(f"this data node key speaks for {held}, which is alive; a key serves "
                            f"one node, not also {node_id[:64]} (give each node its own key: "
                            "`blizzard keys add-node DIR NAME`)")
        self.log(NodeKeyBound(node_id, key))
        log.info("data node %s speaks with key %s%s", node_id, key[:8],
                 f" (moved from {held})" if held else "")

    def check_own(self, node_id: str, peer: bytes) -> None:
        """``Forbidden`` unless the peer's key is bound to ``node_id``: a node's report
        (``PutReport``, ``Replicated``, ``Inventory``) is of its own blobs only."""
        key = self.key_of(peer)
        if key and self.state.node_keys.get(node_id) != key:
            raise Forbidden(f"this data node key does not speak for {node_id[:64]}; a "
                            "node reports on its own blobs only")
