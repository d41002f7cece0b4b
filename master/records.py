"""The master's write-ahead log records: every change to durable state is one of these.

Times in records are wall-clock seconds (``time.time()``), because they must mean the same
thing after a restart. Records share the wire registry, so ``protocol.pack``/``unpack``
serialise them; op codes 100+ are reserved for records.
"""

from __future__ import annotations

from blizzard.protocol import message


@message(100)
class Reserve:
    """Ids below ``id_hi`` may be handed out; a restart resumes allocation at ``id_hi``."""

    id_hi: int


@message(101)
class CommitItems:
    """Items stored on ``nodes`` become visible in ``queue`` (parallel lists, one entry per item)."""

    queue: str
    ids: list[int]
    sizes: list[int]
    crcs: list[int]
    priorities: list[int]
    nodes: list[str]
    at: float
    request: str  # the client's commit id, remembered so a retried commit is answered once


@message(102)
class LeaseItems:
    """Items are handed to a consumer under lease tokens ``leases`` until ``deadline``.

    ``request`` is the client's id for the lease call, so a retry after a lost reply (or a
    master restart) gets the same items instead of leasing more.
    """

    ids: list[int]
    leases: list[int]
    deadline: float
    request: str


@message(103)
class AckItems:
    """Items are done and forgotten."""

    ids: list[int]


@message(104)
class ReleaseItems:
    """Leased items go back to their queue, visible from ``not_before``; each counts an attempt."""

    ids: list[int]
    not_before: float


@message(105)
class NodeSeen:
    """A data node registered at ``addr``; remembered so replicas stay reachable after a restart."""

    node_id: str
    addr: str


@message(106)
class AddReplicas:
    """``node`` now holds a confirmed copy of each of ``ids``."""

    ids: list[int]
    node: str


@message(107)
class DropReplicas:
    """``node`` no longer holds a usable copy of ``ids`` (lost, corrupt, or deleted as excess)."""

    ids: list[int]
    node: str
