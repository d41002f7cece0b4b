"""The signature on a lease answer a data node pushes (docs/design.md "Dequeue").

A consumer's ``Lease`` carries a secret of its own (``push_key``), which only the master gets.
The master hands a data node its answer as the bytes of its frame (``encode(rid, leased)``)
with their signature (``ServeOrder.mac``: HMAC-SHA256 under that secret, cut to 16 bytes);
the node passes both on in ``Pushed``, and the consumer takes a pushed answer only if the
signature is right and the frame answers its request: no data node, nor anyone holding a
data node's key, can make a consumer take an answer the master did not give (wrong items, or
payloads matching made-up sizes and checksums). The bytes travel as they are, never decoded
and encoded again on the way, so nothing can change them but a forger.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from blizzard.wire.codec import decode
from blizzard.wire.errors import ProtocolError

KEY_BYTES = 16
MAC_BYTES = 16


def sign(key: bytes, frame: bytes) -> bytes:
    """The signature of an answer's frame (``encode(rid, leased)``) under ``key``."""
    return hmac.new(key, frame, hashlib.sha256).digest()[:MAC_BYTES]


def opened(key: bytes, rid: int, frame: bytes, mac: bytes) -> Any | None:
    """The answer in ``frame`` if ``mac`` is the master's signature of it under ``key`` and
    it answers request ``rid``; None for anything else."""
    if not hmac.compare_digest(sign(key, frame), mac):
        return None
    try:
        answered, answer = decode(frame)
    except ProtocolError:
        return None
    return answer if answered == rid else None
