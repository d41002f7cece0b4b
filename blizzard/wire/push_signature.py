"""The signature on a lease answer a data node pushes (docs/design.md "Dequeue").

A consumer's ``Lease`` carries a secret of its own (``push_key``), which only the master gets.
The master signs the answer it hands a data node with it (``ServeOrder.mac``: HMAC-SHA256 of
the answer's frame, ``encode(rid, leased)``, cut to 16 bytes), the node passes it on in
``Pushed``, and the consumer takes a pushed answer only if the signature is right: no data
node, nor anyone holding a data node's key, can make a consumer take an answer the master did
not give (wrong items, or payloads matching made-up sizes and checksums).
"""

from __future__ import annotations

import hashlib
import hmac

from blizzard.wire.codec import encode

KEY_BYTES = 16
MAC_BYTES = 16


def sign(key: bytes, frame: bytes) -> bytes:
    """The signature of an answer's frame (``encode(rid, leased)``) under ``key``."""
    return hmac.new(key, frame, hashlib.sha256).digest()[:MAC_BYTES]


def genuine(key: bytes, rid: int, leased: object, mac: bytes) -> bool:
    """Whether ``mac`` is the master's signature of ``leased`` as the answer to ``rid``."""
    return hmac.compare_digest(sign(key, encode(rid, leased)), mac)
