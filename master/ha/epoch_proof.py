"""Proofs of an epoch that only masters can make, so a data node's word cannot fence one.

A master that hears of a newer epoch stops (``master/ha/wal_shipping.py``). Data nodes carry the
newest epoch they have seen from one master to another, so a node's heartbeat names it; but a
node's key must not be able to stop the masters by naming a huge epoch. So every heartbeat
reply carries a MAC of (cluster id, epoch) under a key derived from the master's CURVE secret
key, which every master of the cluster (primary and standbys) holds and no data node does;
a node echoes it, and a secure master believes a node's epoch only with a proof that
verifies. Without security there is nothing to prove with: the bare claim counts, as before.
"""

from __future__ import annotations

import hmac

from blizzard.wire.codec import dumps

PROOF_BYTES = 16


class EpochProof:
    """Makes and checks epoch proofs with the masters' key (None: security off)."""

    def __init__(self, master_secret: bytes | None) -> None:
        self.key = None if master_secret is None else \
            hmac.digest(master_secret, b"blizzard epoch proof", "sha256")

    def make(self, cluster_id: str, epoch: int) -> bytes:
        if self.key is None:
            return b""
        return hmac.digest(self.key, dumps(["epoch", cluster_id, epoch]), "sha256")[:PROOF_BYTES]

    def believes(self, cluster_id: str, epoch: int, proof: bytes) -> bool:
        """True if a node's claim of ``epoch`` is the masters' word (always without security)."""
        return self.key is None or hmac.compare_digest(proof, self.make(cluster_id, epoch))
