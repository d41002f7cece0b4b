"""Capabilities, as HDFS block tokens: the master signs what a client may do on data nodes.

A grant (``PutGrant``, ``GetGrant`` in ``node_messages.py``) names an operation's scope (ids,
data nodes), an expiry and the id of the key that signed it; its MAC is an HMAC-SHA256 over
the operation's name and those fields, cut to 16 bytes. The master issues one grant per
``Placement`` and per ``Leased`` reply; a data node verifies one per request (``KeyRing``),
with a key it learned from the master's heartbeat replies. Only the master and the data
nodes know the keys, so a client can neither forge a grant nor widen one.
"""

from __future__ import annotations

import hmac

from blizzard.errors import Forbidden
from blizzard.node_messages import CapabilityKey, GetGrant, PutGrant
from blizzard.wire import dumps

MAC_BYTES = 16


def sign(key: bytes, op: str, *fields: object) -> bytes:
    """The MAC of an operation and its fields under ``key``."""
    return hmac.digest(key, dumps([op, *fields]), "sha256")[:MAC_BYTES]


def sign_put(key: bytes, key_id: int, expiry: float, first: int, n: int,
             nodes: list[str]) -> bytes:
    """The MAC of a put grant: ids ``first .. first + n - 1`` on ``nodes`` (sorted)."""
    return sign(key, "put", key_id, expiry, first, n, nodes)


def sign_get(key: bytes, key_id: int, expiry: float, ids: list[int], nodes: list[str]) -> bytes:
    """The MAC of a get grant: ``ids`` from ``nodes`` (sorted)."""
    return sign(key, "get", key_id, expiry, ids, nodes)


def check_put_grant(key: bytes, grant: PutGrant, ids: list[int]) -> None:
    """Raise ``Forbidden`` unless ``grant`` verifies under ``key`` and covers ``ids`` (what a
    data node checks of a put, and the master of an enqueue)."""
    if not hmac.compare_digest(grant.mac, sign_put(key, grant.key_id, grant.expiry,
                                                   grant.first, grant.n, grant.nodes)):
        raise Forbidden("the put grant's signature does not verify")
    if ids and (min(ids) < grant.first or max(ids) >= grant.first + grant.n):
        raise Forbidden("the put grant does not cover these ids")


class KeyRing:
    """The keys a data node checks grants with, as the master's last heartbeat reply named them.

    Empty until that first reply: every grant is refused meanwhile.
    """

    def __init__(self) -> None:
        self.keys: dict[int, bytes] = {}

    def load(self, keys: list[CapabilityKey]) -> None:
        """Take the master's current key ring (keys it no longer names are retired)."""
        self.keys = {k.key_id: k.key for k in keys}

    def check_put(self, grant: PutGrant, ids: list[int], node_id: str, now: float) -> None:
        """Raise ``Forbidden`` unless ``grant`` lets ``ids`` be written (or deleted) on this node."""
        check_put_grant(self._key(grant.key_id, grant.expiry, grant.nodes, node_id, now),
                        grant, ids)

    def check_get(self, grant: GetGrant, ids: list[int], node_id: str, now: float) -> None:
        """Raise ``Forbidden`` unless ``grant`` lets ``ids`` be read from this node."""
        key = self._key(grant.key_id, grant.expiry, grant.nodes, node_id, now)
        if not hmac.compare_digest(grant.mac, sign_get(key, grant.key_id, grant.expiry,
                                                       grant.ids, grant.nodes)):
            raise Forbidden("the get grant's signature does not verify")
        if not set(ids) <= set(grant.ids):
            raise Forbidden("the get grant does not cover these ids")

    def _key(self, key_id: int, expiry: float, nodes: list[str], node_id: str,
             now: float) -> bytes:
        """The key a grant names, once its expiry and node list allow it here."""
        if expiry <= now:
            raise Forbidden(f"the grant expired {now - expiry:.1f}s ago")
        if node_id not in nodes:
            raise Forbidden(f"the grant is not for data node {node_id}")
        key = self.keys.get(key_id)
        if key is None:
            raise Forbidden(f"capability key {key_id} is unknown here (retired, or this node "
                            "has not heard from the master yet)")
        return key
