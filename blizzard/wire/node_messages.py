"""The messages of data nodes: to the master (reports) and from clients and peers (blobs).

One family of the protocol; import its messages from ``blizzard.wire.protocol``, the one
namespace of every message. ``NodeRef`` lives here because placements and replica lists use it too;
so do the capabilities (``PutGrant``, ``GetGrant``): the master issues them with placements
and leases, data nodes check them (``blizzard/server/capability.py``).
"""

from __future__ import annotations

from blizzard.wire.codec import Id, field, message
from blizzard.wire.meta_messages import ItemMeta


@message(3)
class NodeRef:
    """Where a data node is: its stable id and the address clients and peers connect to."""

    node_id: str
    addr: str


# ---------------------------------------------------------------------------------------------
# Data node -> master


@message(30)
class Heartbeat:
    """A data node's periodic report; the first one registers it."""

    node_id: str
    addr: str
    items: int
    bytes_used: int
    free_bytes: int
    cluster_id: str = ""  # the cluster this node joined ("": none yet, it adopts the master's)
    epoch: int = 0  # the highest master epoch this node has seen: an older master is fenced
    # the masters' proof of that epoch (a secure master believes no bare claim of an epoch)
    epoch_proof: bytes = b""


@message(31)
class HeartbeatReply:
    """The master's commands for a data node: blobs to delete, blobs to copy, send inventory.

    ``keys`` are the capability keys the node checks grants with (the previous, the current
    and the next one, derived for this node: ``capability.node_key``): a secure node replaces
    its key ring with them on every reply.
    """

    delete: list[Id]
    copies: list[CopyOrder]
    inventory: bool  # the master wants this node's full list of blob ids
    keys: list[CapabilityKey]
    cluster_id: str = ""  # the master's cluster: a node of another one obeys nothing here
    epoch: int = 0  # the master's epoch: a node obeys no master older than one it has seen
    # item metadata (issue 17, rebuild): changed metadata of items this node holds, best effort
    meta: list[ItemMeta] = field(default_factory=list)
    epoch_proof: bytes = b""  # the masters' MAC of (cluster id, epoch), echoed in heartbeats


@message(50)
class CapabilityKey:
    """One of the master's capability signing keys (32 random bytes), by its id."""

    key_id: int
    key: bytes


@message(48)
class PutGrant:
    """A capability to write ids ``first .. first + n - 1`` on ``nodes`` until ``expiry``.

    Issued with a ``Placement``; ``mac`` is the master's HMAC per node over the other fields
    (``capability.sign_put``) with key ``key_id``. Also lets its holder delete those ids.
    """

    first: Id
    n: int
    nodes: list[str]  # node ids, sorted
    key_id: int
    expiry: float  # unix time: wall clocks of master and nodes must roughly agree
    mac: bytes


@message(49)
class GetGrant:
    """A capability to read ``ids`` from ``nodes`` until ``expiry``: issued with a ``Leased``.

    ``mac`` is the master's HMAC per node over the other fields (``capability.sign_get``).
    """

    ids: list[Id]
    nodes: list[str]  # node ids holding them, sorted
    key_id: int
    expiry: float  # unix time
    mac: bytes


@message(75)
class Regrant:
    """Client -> master: a fresh ``GetGrant`` for items still leased under these tokens
    (a grant ends with the leases it came with; extending them does not renew it)."""

    ids: list[Id]
    leases: list[int]


@message(76)
class Regranted:
    """Reply to Regrant: a grant for the ids still held (until their leases end); ``lost``
    lists the ones no longer leased under the tokens given."""

    grant: GetGrant
    lost: list[Id]


@message(32)
class CopyOrder:
    """Copy these blobs to ``target`` (re-replication), then report with ``Replicated``."""

    target: NodeRef
    ids: list[Id]


@message(33)
class Replicated:
    """A data node copied ``ids`` to ``target``; ``missing`` were absent or corrupt at the
    source."""

    node_id: str
    target: str
    ids: list[Id]
    missing: list[Id]


@message(34)
class Inventory:
    """A chunk of a data node's blob ids; ``done`` marks the last chunk."""

    node_id: str
    ids: list[Id]
    done: bool


@message(39)
class PutReport:
    """A data node stored ``ids`` durably (puts sent with ``report``); ``failed`` it refused.

    Sent once per loop pass after the pass's write is synced; ``error`` says why the failed
    ones were refused.
    """

    node_id: str
    ids: list[Id]
    failed: list[Id]
    error: str


@message(35)
class BadReplica:
    """A client found these replicas missing or failing their checksum (parallel lists)."""

    ids: list[Id]
    node_ids: list[str]


# ---------------------------------------------------------------------------------------------
# Client -> data node


@message(40)
class Put:
    """Phase 2 of an enqueue: store these blobs durably (checksums are CRC-32 of each blob)."""

    ids: list[Id]
    blobs: list[bytes]
    crcs: list[int]
    forward: list[NodeRef]  # other replicas this node passes the blobs to
    min_replicas: int  # reply only when this many nodes (this one included) hold every blob
    node_id: str  # the node meant to store them: a new node at a dead one's address refuses
    # tell the master (``PutReport``), not the sender: a client's ``Enqueue`` waits on it
    report: bool
    # None: a relay or copy between data nodes (their key proves who they are)
    grant: PutGrant | None
    meta: list[ItemMeta] = field(default_factory=list)  # kept beside the blobs (see ItemMeta)


@message(41)
class Stored:
    """Reply to Put: the node ids that durably hold every blob (fewer than asked if replicas
    failed)."""

    nodes: list[str]


@message(42)
class Get:
    """Read blobs by id; ``ids`` must lie within the grant's."""

    ids: list[Id]
    grant: GetGrant | None


@message(43)
class Blobs:
    """Reply to Get: blobs found intact, in request order; ``missing`` lists ids absent or corrupt.

    A reply carries at most about 20 MiB of blobs: an id in neither list was not reached and
    must be asked for again.
    """

    ids: list[Id]
    blobs: list[bytes]
    crcs: list[int]
    missing: list[Id]


@message(44)
class Delete:
    """Drop blobs by id (unknown ids are ignored).

    A secure node takes it from a data node or admin key, or with the put grant of the ids
    (a client cleaning up ids it never enqueued).
    """

    ids: list[Id]
    grant: PutGrant | None
