"""Which data nodes exist, which are alive, and where new items go (time is passed in)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument

MAX_NODES = 1024  # distinct data node ids the master will know (each is kept in the WAL)
MIN_FREE_BYTES = 64 * 1024 * 1024  # placement avoids nodes with less free disk than this


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

    def __init__(self, dead_after_s: float) -> None:
        self.dead_after_s = dead_after_s
        self.nodes: dict[str, NodeInfo] = {}
        self._turn = 0

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

    def refs(self, node_ids: tuple[str, ...], known: dict[str, str]) -> list[p.NodeRef]:
        """Replica addresses, live nodes first (``known``: last addresses of absent nodes)."""
        now = time.monotonic()
        refs = []
        for node_id in node_ids:
            node = self.nodes.get(node_id)
            alive = node is not None and self.is_alive(node, now)
            addr = node.addr if node is not None else known.get(node_id, "")
            refs.append((not alive, p.NodeRef(node_id, addr)))
        refs.sort(key=lambda r: r[0])
        return [r for _, r in refs]

    def is_alive(self, node: NodeInfo, now: float) -> bool:
        return now - node.last_seen < self.dead_after_s

    def alive(self, now: float) -> list[NodeInfo]:
        return [n for n in self.nodes.values() if self.is_alive(n, now)]

    def place(self, copies: int, exclude: set[str], now: float) -> list[NodeInfo]:
        """Pick up to ``copies`` distinct live nodes, rotating the start so load spreads."""
        candidates = sorted((n for n in self.alive(now) if n.node_id not in exclude),
                            key=lambda n: n.node_id)
        roomy = [n for n in candidates if n.free_bytes >= MIN_FREE_BYTES]
        pool = roomy if len(roomy) >= copies else candidates
        if not pool:
            return []
        self._turn = (self._turn + 1) % len(pool)
        rotated = pool[self._turn:] + pool[:self._turn]
        return rotated[:copies]
