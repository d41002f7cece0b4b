"""The item metadata data nodes keep beside each blob, and the paged read a rebuild makes of it.

One family of the protocol; import its messages from ``blizzard.wire.protocol``, the one
namespace of every message. A producer's ``Put``
carries its items' metadata (one ``ItemMeta`` for the whole put: a chunk shares its queue and
options), a copy between data nodes carries the copied items', and the master sends changes
(attempts, a dead-letter move, a delay) on heartbeat replies, best effort. A master that lost
its data dir pages through every node's metadata with ``ListMeta`` and rebuilds its queues
from it (``master/ha/rebuild.py``). The checks both sides apply are
``blizzard/wire/item_meta.py``'s.
"""

from __future__ import annotations

from blizzard.wire.codec import Id, message


@message(79)
class ItemMeta:
    """What a rebuild needs to put items back in line, shared by ``ids``.

    In a producer's ``Put``, ``ids`` is empty: the metadata is every id's of the put. Elsewhere
    it lists the ids the metadata is of.
    """

    ids: list[Id]
    queue: str
    priority: int
    not_before: float  # unix time; 0: visible at once
    key: str  # "": no key
    attempts: int  # deliveries that ended without an ack (0 on a producer's put)
    origin: str  # a dead item's: the queue it died in ("" for a live one)


@message(77)
class ListMeta:
    """Master (rebuilding) -> data node: the metadata of up to ``limit`` items from id ``start``
    on, ascending. Needs a data node or admin key on a secure node."""

    start: Id
    limit: int


@message(78)
class MetaPage:
    """Reply to ListMeta: one page of the node's items, grouped by equal metadata.

    ``sizes`` and ``crcs`` follow the ids of ``metas`` in order. ``next`` is where the next
    page starts; ``done``: there is none. ``id_hi`` is above every id this node ever stored,
    deleted ones too, so a rebuilt master never hands an id out again (P4).
    """

    node_id: str
    addr: str
    cluster_id: str
    id_hi: int
    metas: list[ItemMeta]
    sizes: list[int]
    crcs: list[int]
    next: Id
    done: bool
