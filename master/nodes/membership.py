"""Which data nodes exist, which are alive or suspect, and where new items go (time is passed in).

A node is dead once silent for ``dead_after_s``; long before that it is *suspect*: silent for
``suspect_after_s`` (a few missed heartbeats). A suspect node is placed only when too few
healthy ones are left, is listed last among an item's replicas, and is named to clients in
placements and leases (``suspects``), so they skip it at once instead of timing out on it
(docs/design.md, liveness). Only the node's own silence makes it suspect: a write that a node
was slow to store is hedged (``master/produce/enqueue.py``), and the client that wrote it avoids the
node for a while, but nothing a client does or leaves undone can make the master suspect a
healthy node for everyone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument

MAX_NODES = 1024  # distinct data node ids the master will know (each is kept in the WAL)
MIN_FREE_BYTES = 64 * 1024 * 1024  # placement avoids nodes with less free disk than this
MAX_SUSPECTS = 32  # nodes named in one reply's ``suspects``: the most recently heard of first
SUSPECTS_FRESH_S = 0.05  # the list is worked out at most this often
NAMED_DEAD_S = 60.0  # a dead node is named this long after it died, then left out (its
# replicas are listed last anyway, and a wiped node's old id would be named for ever)


@dataclass
class NodeInfo:
    """What the master knows of one data node from its heartbeats."""

    node_id: str
    addr: str
    last_seen: float  # monotonic seconds
    items: int = 0
    bytes_used: int = 0
    free_bytes: int = 0
    peer: bytes = b""  # the connection its heartbeats come from: only it may report puts


class Membership:
    """Data nodes by id, liveness by heartbeat age, round-robin placement over live nodes."""

    def __init__(self, dead_after_s: float, suspect_after_s: float | None = None) -> None:
        self.dead_after_s = dead_after_s
        self.suspect_after_s = dead_after_s / 2 if suspect_after_s is None \
            else min(suspect_after_s, dead_after_s)
        self.nodes: dict[str, NodeInfo] = {}
        self._turn = 0
        self._suspects: tuple[float, list[str]] = (-1.0, [])  # (worked out at, node ids)

    def heartbeat(self, node_id: str, addr: str, items: int, bytes_used: int,
                  free_bytes: int, now: float, peer: bytes = b"") -> bool:
        """Record a heartbeat; return True if the node is new (or was dead) until now.

        A live node keeps its address: a heartbeat naming a live node's id from another
        address is an impostor (or a misconfigured twin) and is refused, so it cannot take
        over the node's puts. A node that restarts elsewhere moves once the old one is dead.
        """
        node = self.nodes.get(node_id)
        fresh = node is None or not self.is_alive(node, now)
        if node is not None and not fresh and node.addr != addr:
            raise InvalidArgument(f"data node {node_id} is alive at {node.addr}; a heartbeat from "
                                  f"{addr[:80]} cannot claim its id")
        if node is None:
            if len(self.nodes) >= MAX_NODES:
                self._forget_one_dead(now)
            if len(self.nodes) >= MAX_NODES:
                raise InvalidArgument(f"the master knows {MAX_NODES} data nodes; no more join")
            node = self.nodes[node_id] = NodeInfo(node_id, addr, now)
        node.addr = addr
        node.peer = peer
        node.last_seen = now
        node.items, node.bytes_used, node.free_bytes = items, bytes_used, free_bytes
        return fresh

    def speaks_for(self, node_id: str, peer: bytes) -> bool:
        """True if ``peer`` is the connection ``node_id`` heartbeats from (a report is its own)."""
        node = self.nodes.get(node_id)
        return node is not None and node.peer == peer

    def _forget_one_dead(self, now: float) -> None:
        dead = [n for n in self.nodes.values() if not self.is_alive(n, now)]
        if dead:
            del self.nodes[min(dead, key=lambda n: n.last_seen).node_id]

    def refs(self, node_ids: tuple[str, ...], known: dict[str, str],
             now: float | None = None) -> list[p.NodeRef]:
        """Replica addresses: healthy nodes first, then suspect ones, then dead or unknown ones
        (``known``: last addresses of absent nodes; ``now``: monotonic, default the clock's)."""
        now = time.monotonic() if now is None else now
        refs = []
        for node_id in node_ids:
            node = self.nodes.get(node_id)
            rank = 2 if node is None or not self.is_alive(node, now) else \
                int(self.is_suspect(node, now))
            addr = node.addr if node is not None else known.get(node_id, "")
            refs.append((rank, p.NodeRef(node_id, addr)))
        refs.sort(key=lambda r: r[0])
        return [r for _, r in refs]

    def is_alive(self, node: NodeInfo, now: float) -> bool:
        return now - node.last_seen < self.dead_after_s

    def is_suspect(self, node: NodeInfo, now: float) -> bool:
        """Silent past ``suspect_after_s`` (dead nodes are suspect too)."""
        return now - node.last_seen >= self.suspect_after_s

    def suspects(self, now: float) -> list[str]:
        """Suspect nodes and those dead for less than ``NAMED_DEAD_S``, the most recently heard
        of first, at most ``MAX_SUSPECTS`` (told to clients in every placement and lease reply,
        so worked out once a moment)."""
        at, names = self._suspects
        if now - at < SUSPECTS_FRESH_S:
            return names
        forgotten = self.dead_after_s + NAMED_DEAD_S
        bad = [n for n in self.nodes.values()
               if self.is_suspect(n, now) and now - n.last_seen < forgotten]
        if len(bad) > MAX_SUSPECTS:
            bad = sorted(bad, key=lambda n: -n.last_seen)[:MAX_SUSPECTS]
        names = sorted(n.node_id for n in bad)
        self._suspects = (now, names)
        return names

    def alive(self, now: float) -> list[NodeInfo]:
        return [n for n in self.nodes.values() if self.is_alive(n, now)]

    def place(self, copies: int, exclude: set[str], now: float) -> list[NodeInfo]:
        """Pick up to ``copies`` distinct live nodes, rotating the start so load spreads.

        Healthy nodes with room come first; suspect ones only make up a shortfall (a write on a
        suspect node is better than none: the master hedges it onto another node if it stalls).
        """
        candidates = sorted((n for n in self.alive(now) if n.node_id not in exclude),
                            key=lambda n: n.node_id)
        healthy = [n for n in candidates if not self.is_suspect(n, now)]
        roomy = [n for n in healthy if n.free_bytes >= MIN_FREE_BYTES]
        pool = roomy if len(roomy) >= copies else healthy
        if not pool:
            pool = candidates
        if not pool:
            return []
        self._turn = (self._turn + 1) % len(pool)
        rotated = pool[self._turn:] + pool[:self._turn]
        chosen = rotated[:copies]
        if len(chosen) < copies:  # too few healthy nodes: suspect ones make up the rest
            chosen += [n for n in candidates if n not in chosen][:copies - len(chosen)]
        return chosen

    def spares(self, copies: int, exclude: set[str], now: float) -> list[NodeInfo]:
        """Up to ``copies`` healthy live nodes outside ``exclude``, for a write's hedge (never a
        suspect one, which the hedge would wait on again); those with room first."""
        healthy = [n for n in self.alive(now) if n.node_id not in exclude
                   and not self.is_suspect(n, now)]
        self._turn += 1
        k = self._turn % len(healthy) if healthy else 0
        healthy = healthy[k:] + healthy[:k]  # rotate among equals so hedges spread too
        healthy.sort(key=lambda n: n.free_bytes < MIN_FREE_BYTES)
        return healthy[:copies]
