"""Chaos payloads: each carries its sequence number and a SHA-256 of its body.

Layout: ``b"chaos seq=<n> sha256=<hex of body>\\n" + body``. The body is derived from the
run's seed and the sequence number, so the same run makes the same bytes. The history keeps
only digests of whole payloads; the checker compares what went in with what came out.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

HEADER = re.compile(rb"chaos seq=(\d+) sha256=([0-9a-f]{64})\n")
MIN_BODY = 16
MAX_BODY = 1024


def make(seed: int, seq: int) -> bytes:
    """The payload for item ``seq`` of a run with ``seed``."""
    rng = random.Random(f"{seed}/{seq}")
    body = rng.randbytes(rng.randint(MIN_BODY, MAX_BODY))
    return b"chaos seq=%d sha256=%s\n" % (seq, hashlib.sha256(body).hexdigest().encode()) + body


def digest(data: bytes) -> str:
    """A short fingerprint of a whole payload, as the history records it."""
    return hashlib.sha256(data).hexdigest()[:24]


@dataclass(frozen=True)
class Parsed:
    """What a dequeued payload says about itself."""

    seq: int | None  # None: no readable header
    intact: bool  # the header's SHA-256 matches the body
    digest: str


def parse(data: bytes) -> Parsed:
    m = HEADER.match(data)
    if m is None:
        return Parsed(None, False, digest(data))
    body = data[m.end():]
    intact = hashlib.sha256(body).hexdigest().encode() == m.group(2)
    return Parsed(int(m.group(1)), intact, digest(data))
