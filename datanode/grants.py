"""Who may put, get and delete on a secure data node: a grant from the master, or a node key.

A client's request carries the grant the master gave it (``Placement``, ``Leased``); another
data node's relay or copy carries none, and is taken because CURVE proved the peer holds a
data node's key (``RouterServer.role_of``). Anything else gets ``Forbidden``. A node without
security (no key directory) checks nothing: ``Gate`` is not used there.

A put grant lives until its placement's deadline, also after its ids were enqueued; so it
only ever adds blobs: a put with it must report to the master (which then counts the blobs,
or orders strays deleted), never replaces a blob the node holds (``DatanodeServer``), and
deletes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from blizzard.server.capability import KeyRing
from blizzard.wire import protocol as p
from blizzard.wire.errors import Forbidden

# Roles that may delete blobs without a grant. Not ``node``: a node deletes its own blobs on
# the master's word (heartbeat replies) and never asks another node to, so another node's key
# must not (one stolen node key would erase every replica).
DELETERS = ("admin",)


class Gate:
    """The grant checks of one secure data node, with the key ring the master sends it."""

    def __init__(self, node_id: str, role_of: Callable[[bytes], str | None]) -> None:
        self.node_id = node_id
        self.role_of = role_of
        self.ring = KeyRing()

    def learn(self, keys: list[p.CapabilityKey]) -> None:
        """The master's key ring from a heartbeat reply."""
        self.ring.load(keys)

    def check_put(self, msg: p.Put, peer: bytes) -> None:
        if msg.forward and self.role_of(peer) != "node":  # a grant names its nodes: no others
            raise Forbidden("only data nodes may name replicas to forward a put to")
        if msg.grant is not None:
            if not msg.report:  # else the master would never hear of these ids (nor delete them)
                raise Forbidden("a put with a grant must report to the master (report=True)")
            self.ring.check_put(msg.grant, msg.ids, self.node_id, time.time())
        elif self.role_of(peer) != "node":
            raise Forbidden("a put needs the master's grant (only data nodes relay without one)")

    def check_get(self, msg: p.Get, peer: bytes) -> None:
        if msg.grant is None:
            raise Forbidden("a get needs the master's grant (from the lease)")
        self.ring.check_get(msg.grant, msg.ids, self.node_id, time.time())

    def check_delete(self, msg: p.Delete, peer: bytes) -> None:
        # A put grant deletes nothing: it lives on after its ids are enqueued, and the master
        # deletes the blobs of ids never enqueued itself (block expiry, failed enqueues).
        if self.role_of(peer) not in DELETERS:
            raise Forbidden("a delete needs an admin key (a put grant deletes nothing; a data "
                            "node deletes only its own blobs)")
