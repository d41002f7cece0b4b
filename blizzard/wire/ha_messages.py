"""The messages of high availability: a standby following the primary's WAL, and promotion.

One family of the protocol; import its messages from ``blizzard.wire.protocol``, the one
namespace of every message. A standby asks with ``Follow``, naming how far it has the log durably;
that also acknowledges everything before it, which is what a primary with a synchronous
standby waits for before it answers a client (``master/ha/wal_shipping.py``).
"""

from __future__ import annotations

from blizzard.wire.codec import message
from blizzard.wire.node_messages import CapabilityKey


@message(80)
class Follow:
    """Standby -> primary: "I hold your log durably up to (segment, offset); send what follows".

    ``epoch`` and ``cluster_id`` are the standby's; a standby of another epoch (or with no
    log yet: epoch -1) is sent a snapshot. While it receives one, ``segment`` is
    ``-wal_start - 1`` and ``offset`` the bytes of that checkpoint it has. ``addr`` is where the
    standby serves, so the primary can ask it whether it was promoted.
    """

    name: str
    addr: str
    cluster_id: str
    epoch: int
    segment: int
    offset: int


@message(81)
class WalData:
    """Primary -> standby: whole WAL records as written, from (segment, offset) on.

    ``data`` may be empty (nothing new: the reply is the primary's sign of life). ``keys`` is
    the primary's capability key ring, so a promoted standby honours the grants it issued.
    """

    epoch: int
    segment: int
    offset: int
    data: bytes
    keys: list[CapabilityKey]
    keys_rotated_at: float  # when the ring last moved on (``master/nodes/grant_keys.py``)
    at_end: bool  # ``data`` reaches the end of the primary's log on disk: the standby caught up


@message(82)
class SnapshotData:
    """Primary -> standby: part of the primary's newest checkpoint (the standby starts over).

    The checkpoint file ``checkpoint-<wal_start>`` is ``total`` bytes; this is ``data`` from
    ``offset`` on. After the last part the standby follows the log from (wal_start, 0).
    """

    epoch: int
    wal_start: int
    offset: int
    total: int
    data: bytes


@message(83)
class Promote:
    """Admin -> standby: become the primary now (``force``: even if not in sync)."""

    force: bool


@message(84)
class Promoted:
    """Reply to Promote: the new epoch."""

    epoch: int
