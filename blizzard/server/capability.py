"""Capabilities, as HDFS block tokens: the master signs what a client may do on data nodes.

A grant (``PutGrant``, ``GetGrant`` in ``node_messages.py``) names an operation's scope (ids,
data nodes), an expiry and the id of the key that signed it. Its MAC is one HMAC-SHA256 per
node it names, in the order of ``nodes``, each cut to 16 bytes, over the operation's name and
those fields, under that node's own key: ``node_key(key, node_id)``, derived from the
master's ring key. The master issues one grant per ``Placement`` and per ``Leased`` reply; a
data node verifies its own MAC of one per request (``KeyRing``; a put grant once, as it serves
a placement's many puts: ``Verified``), with the keys it learned from the master's heartbeat
replies, which carry that node's derived keys only. So a client
can neither forge a grant nor widen one, and a data node (or a thief of its key) can sign
grants that only it accepts.
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Callable

from blizzard.wire.codec import dumps
from blizzard.wire.errors import Forbidden
from blizzard.wire.node_messages import CapabilityKey, GetGrant, PutGrant

MAC_BYTES = 16
VERIFIED = 4096  # put grants remembered as verified (a producer's block shows one many times)


@functools.lru_cache(maxsize=4096)  # a ring of 3 keys for up to 1,024 nodes, and no more
def node_key(key: bytes, node_id: str) -> bytes:
    """Data node ``node_id``'s own key derived from the master's ring key ``key``."""
    return hmac.digest(key, b"node:" + node_id.encode(), "sha256")


def sign(key: bytes, op: str, *fields: object) -> bytes:
    """The MAC of an operation and its fields under ``key``."""
    return hmac.digest(key, dumps([op, *fields]), "sha256")[:MAC_BYTES]


def node_mac(key: bytes, op: str, nodes: list[str], *fields: object) -> bytes:
    """One node's MAC of a grant, under that node's key ``key``."""
    return sign(key, op, *fields, nodes)


def sign_nodes(key: bytes, op: str, nodes: list[str], *fields: object) -> bytes:
    """A grant's MAC: one per node of ``nodes``, each under that node's key (what
    ``node_mac`` computes, the fields encoded once)."""
    body = dumps([op, *fields, nodes])
    return b"".join(hmac.digest(node_key(key, node), body, "sha256")[:MAC_BYTES]
                    for node in nodes)


def sign_put(key: bytes, key_id: int, expiry: float, first: int, n: int,
             nodes: list[str]) -> bytes:
    """The MAC of a put grant: ids ``first .. first + n - 1`` on ``nodes`` (sorted)."""
    return sign_nodes(key, "put", nodes, key_id, expiry, first, n)


def sign_get(key: bytes, key_id: int, expiry: float, ids: list[int], nodes: list[str]) -> bytes:
    """The MAC of a get grant: ``ids`` from ``nodes`` (sorted)."""
    return sign_nodes(key, "get", nodes, key_id, expiry, ids)


def _slice(mac: bytes, nodes: list[str], node_id: str) -> bytes:
    """The part of a grant's MAC that is ``node_id``'s ("" if it names no such node)."""
    if node_id not in nodes or len(mac) != MAC_BYTES * len(nodes):
        return b""
    at = nodes.index(node_id) * MAC_BYTES
    return mac[at:at + MAC_BYTES]


class Verified:
    """Put grants whose MAC verified lately, each with the key it verified under.

    A producer shows one grant with every put and enqueue of a placement (up to 4,000 ids,
    one item a call), so one HMAC serves them all. The key is part of what is remembered: a
    grant under a key since retired or replaced is checked again, and refused. At most
    ``size`` grants; past that the memory starts afresh.
    """

    def __init__(self, size: int = VERIFIED) -> None:
        self.size = size
        self.seen: set[tuple[object, ...]] = set()

    @staticmethod
    def _entry(key: bytes, grant: PutGrant, mac: bytes) -> tuple[object, ...]:
        return key, grant.key_id, grant.expiry, grant.first, grant.n, tuple(grant.nodes), mac

    def check(self, key: bytes, grant: PutGrant, mac: bytes, expected: Callable[[], bytes]) -> None:
        """Raise ``Forbidden`` unless ``mac`` is ``expected()`` (computed only for a grant not
        verified under ``key`` before)."""
        entry = self._entry(key, grant, mac)
        if entry in self.seen:
            return
        if not hmac.compare_digest(mac, expected()):
            raise Forbidden("the put grant's signature does not verify")
        if len(self.seen) >= self.size:
            self.seen.clear()
        self.seen.add(entry)


def check_put_grant(key: bytes, grant: PutGrant, ids: list[int], verified: Verified) -> None:
    """Raise ``Forbidden`` unless ``grant`` verifies under the ring key ``key`` (every node's
    MAC) and covers ``ids`` (what the master checks of an enqueue); ``verified``: grants
    checked before, not checked again."""
    verified.check(key, grant, grant.mac, lambda: sign_put(
        key, grant.key_id, grant.expiry, grant.first, grant.n, grant.nodes))
    _covers(grant, ids)


def _covers(grant: PutGrant, ids: list[int]) -> None:
    if ids and (min(ids) < grant.first or max(ids) >= grant.first + grant.n):
        raise Forbidden("the put grant does not cover these ids")


class KeyRing:
    """The keys a data node checks grants with, as the master's last heartbeat reply named them
    (this node's own, derived from the master's ring: ``node_key``).

    Empty until that first reply: every grant is refused meanwhile.
    """

    def __init__(self) -> None:
        self.keys: dict[int, bytes] = {}
        self.verified = Verified()  # put grants checked before (``Verified``)

    def load(self, keys: list[CapabilityKey]) -> None:
        """Take the master's current key ring (keys it no longer names are retired)."""
        self.keys = {k.key_id: k.key for k in keys}

    def check_put(self, grant: PutGrant, ids: list[int], node_id: str, now: float) -> None:
        """Raise ``Forbidden`` unless ``grant`` lets ``ids`` be written (or deleted) on this
        node."""
        key = self._key(grant.key_id, grant.expiry, grant.nodes, node_id, now)
        self.verified.check(key, grant, _slice(grant.mac, grant.nodes, node_id), lambda: node_mac(
            key, "put", grant.nodes, grant.key_id, grant.expiry, grant.first, grant.n))
        _covers(grant, ids)

    def check_get(self, grant: GetGrant, ids: list[int], node_id: str, now: float) -> None:
        """Raise ``Forbidden`` unless ``grant`` lets ``ids`` be read from this node."""
        key = self._key(grant.key_id, grant.expiry, grant.nodes, node_id, now)
        if not hmac.compare_digest(_slice(grant.mac, grant.nodes, node_id), node_mac(
                key, "get", grant.nodes, grant.key_id, grant.expiry, grant.ids)):
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
