"""The signature on an enqueue a data node passes on to the master (``Relay``; docs/design.md
"Data path", Enqueue).

The master hands each placement a key of its own (``Placement.relay_key``) over the
producer's connection to the master, which data nodes never see. A producer that sends its
``Enqueue`` with its payloads to a data node signs the request's frame, and the routing id
its answer is to go to, under that key; the node passes the three on untouched, and the
master serves the enqueue only if the signature is right. So no data node, nor anyone
holding a data node's key, can make up an enqueue, change one, or send its answer elsewhere.
"""

from __future__ import annotations

from blizzard.wire import push_signature

KEY_BYTES = 16
REPLY_TO_BYTES = 16  # a client's routing id (``DatanodePool.routing_id``)


def sign(key: bytes, reply_to: bytes, frame: bytes) -> bytes:
    """The signature of an enqueue's frame (``encode(rid, enqueue)``) and where its answer
    goes, under the placement's ``key``."""
    return push_signature.sign(key, reply_to + frame)
