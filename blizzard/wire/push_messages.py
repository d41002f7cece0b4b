"""The messages of leases a data node answers on the master's order, payloads and all.

One family of the protocol; import its messages from ``blizzard.wire.protocol``, the one
namespace of every message. A consumer's ``Lease`` names where (``push_to``) and a secret
(``push_key``); the master hands the answer to a data node that waits for orders
(``AwaitServes``, ``Serves``: ``master/consume/pushes.py``), signed (``push_signature.py``); the
node sends it on with the payloads (``Pushed``: ``datanode/serves.py``); docs/design.md "Data
path".
"""

from __future__ import annotations

from blizzard.wire.codec import Id, message


@message(92)
class AwaitServes:
    """A data node waits (parked at the master) for orders to answer leases itself
    (``Serves``), and tells which orders of the last ``Serves`` it carried out."""

    node_id: str
    served: list[int]  # the orders' ``seq``s answered with ``Pushed``
    failed: list[int]  # ... not answered (the consumer is not connected here, say)


@message(93)
class ServeOrder:
    """Answer the lease that consumer ``to`` (its connection's routing id) sent as request
    ``rid`` (``Pushed``): ``answer`` is the master's answer as its frame would be, the
    ``Leased`` of items ``ids``, and ``mac`` its signature under the consumer's
    ``push_key``; the node passes both on as they are, with the items' payloads."""

    seq: int
    to: bytes
    rid: int
    ids: list[Id]
    answer: bytes
    mac: bytes


@message(94)
class Serves:
    """Reply to ``AwaitServes``: leases for the data node to answer (none: ask again)."""

    orders: list[ServeOrder]


@message(95)
class Pushed:
    """A lease's answer sent by a data node on the master's order: the master's answer (the
    frame of a ``Leased``) with its signature (``ServeOrder``) and, as a ``Blobs``, the
    payloads the node holds intact (``missing``: the others)."""

    answer: bytes
    mac: bytes
    ids: list[Id]
    blobs: list[bytes]
    crcs: list[int]
    missing: list[Id]
