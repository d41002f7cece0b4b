"""The pure part of a rebuild: the data nodes' metadata pages folded into WAL records.

``NodeScan`` is what one node sent (``MetaPage`` after ``MetaPage``, each checked by ``take``);
``fold`` makes the records a new master logs: the nodes' cluster id (``ClusterCreated``), each
node's address (``NodeSeen``), an id high-water above every id any node ever stored plus
``ID_MARGIN`` (``Reserve``: ids never reused, P4), and the items (``RebuildItems``), grouped by
queue and replica set.

An item held by several nodes gets all of them as replicas, and the metadata of the one that
heard of the most deliveries (an update the others missed). Holders that disagree on its
size or checksum are left out in favour of the most common pair (their copy is not the
item's). Nothing here touches a socket, file or clock: ``at`` is passed in.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise

from blizzard.net.addrs import check_addr
from blizzard.wire import item_meta
from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument
from master.rules import arguments
from master.state.records import ClusterCreated, NodeSeen, RebuildItems, Reserve

# Ids a dead master may have handed out above every id a node stored: at most 1,000,000 held
# by producers (``master/produce/placements.py``) plus a reserved block; ids are 63-bit, so be
# generous.
ID_MARGIN = 10_000_000
RECORD_ITEMS = 10_000  # items per RebuildItems record


@dataclass
class NodeScan:
    """One data node's answer: who it is and its items (id -> (size, crc, metadata))."""

    node_id: str
    addr: str
    cluster_id: str
    id_hi: int = 0
    items: dict[int, tuple[int, int, p.ItemMeta]] = field(default_factory=dict)
    next: int = 0  # where the next page starts

    def take(self, page: p.MetaPage) -> None:
        """Add one page after checking it whole (``InvalidArgument`` naming the fault, P7):
        the same node, ids ascending from where the last page ended, valid metadata, sizes and
        checksums; nothing is added from a bad page."""
        if page.node_id != self.node_id or page.cluster_id != self.cluster_id:
            raise InvalidArgument(f"node {self.node_id} answered as {page.node_id[:64]!r} of "
                                  f"cluster {page.cluster_id[:64]!r} mid-scan")
        ids = [i for meta in page.metas for i in meta.ids]
        if len(ids) != len(page.sizes) or len(ids) != len(page.crcs):
            raise InvalidArgument(f"a page of {self.node_id}: {len(ids)} ids, "
                                  f"{len(page.sizes)} sizes, {len(page.crcs)} checksums")
        if any(b <= a for a, b in pairwise(ids)) or (ids and ids[0] < self.next):
            raise InvalidArgument(f"a page of {self.node_id} lists ids out of order")
        if ids and (page.next <= ids[-1] or page.id_hi <= ids[-1]):
            raise InvalidArgument(f"a page of {self.node_id} ends before its own ids")
        if not page.done and page.next <= self.next:
            raise InvalidArgument(f"a page of {self.node_id} does not move on")
        if page.sizes and (min(page.sizes) < 0 or max(page.sizes) > p.MAX_ITEM_BYTES):
            raise InvalidArgument(f"a page of {self.node_id} has a size out of range")
        if page.crcs and (min(page.crcs) < 0 or max(page.crcs) >= 2**32):
            raise InvalidArgument(f"a page of {self.node_id} has a checksum out of range")
        for meta in page.metas:
            item_meta.check(meta)
        k = 0
        for meta in page.metas:
            for item_id in meta.ids:
                self.items[item_id] = (page.sizes[k], page.crcs[k], meta)
                k += 1
        self.id_hi = max(self.id_hi, page.id_hi)
        self.next = page.next


@dataclass
class Rebuilt:
    """What a rebuild logs, and what it found."""

    cluster_id: str
    id_hi: int
    records: list
    items: int


def check_node(page: p.MetaPage) -> NodeScan:
    """The scan a node's first page starts (its id, address and cluster checked)."""
    arguments.node_id(page.node_id)
    check_addr(page.addr)
    if not page.cluster_id:
        raise InvalidArgument(f"data node {page.node_id} has no cluster id (it never "
                              "reached a master): it holds nothing to rebuild from")
    return NodeScan(page.node_id, page.addr, page.cluster_id)


def _latest(metas: list[p.ItemMeta]) -> p.ItemMeta:
    """The metadata that heard of the most deliveries (a dead-letter move counts as one more)."""
    return max(metas, key=lambda m: (m.attempts, bool(m.origin)))


def fold(scans: list[NodeScan], at: float) -> Rebuilt:
    """The records a master rebuilt from ``scans`` logs, in order (see the module docstring)."""
    if not scans:
        raise InvalidArgument("a rebuild needs at least one data node")
    clusters = sorted({s.cluster_id for s in scans})
    if len(clusters) > 1:
        raise InvalidArgument(f"the data nodes belong to different clusters {clusters}: list "
                              "only the nodes of the cluster to rebuild")
    held: dict[int, list[tuple[str, tuple[int, int, p.ItemMeta]]]] = {}
    for scan in scans:
        for item_id, entry in scan.items.items():
            held.setdefault(item_id, []).append((scan.node_id, entry))
    groups: dict[tuple[str, tuple[str, ...]], list[tuple[int, int, int, p.ItemMeta]]] = {}
    for item_id in sorted(held):
        holders = held[item_id]
        size, crc = Counter((e[0], e[1]) for _, e in holders).most_common(1)[0][0]
        agreeing = [(node, e) for node, e in holders if (e[0], e[1]) == (size, crc)]
        meta = _latest([e[2] for _, e in agreeing])
        nodes = tuple(sorted(node for node, _ in agreeing))
        groups.setdefault((meta.queue, nodes), []).append((item_id, size, crc, meta))
    id_hi = max([s.id_hi for s in scans] + [max(held, default=0) + 1]) + ID_MARGIN
    records: list = [ClusterCreated(clusters[0])]
    records += [NodeSeen(s.node_id, s.addr) for s in scans]
    records.append(Reserve(id_hi))
    for (queue, nodes), items in groups.items():
        for start in range(0, len(items), RECORD_ITEMS):
            part = items[start:start + RECORD_ITEMS]
            records.append(RebuildItems(
                queue, list(nodes), at, [i for i, _, _, _ in part],
                [m.attempts for *_, m in part], [m.origin for *_, m in part],
                [s for _, s, _, _ in part], [c for _, _, c, _ in part],
                [m.priority for *_, m in part], [m.not_before for *_, m in part],
                [m.key for *_, m in part]))
    return Rebuilt(clusters[0], id_hi, records, len(held))
