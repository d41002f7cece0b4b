"""Every message Blizzard sends: the one namespace for message shapes.

Import messages from here (``from blizzard.wire import protocol as p``), whatever family
defines them. This module defines the shared shapes and the client's and admin's messages to
the master; the other families are modules of their own, each about one conversation, and are
re-exported here:

- ``node_messages``: data nodes' reports to the master, and blobs between clients and nodes;
- ``meta_messages``: item metadata kept beside the blobs, and the paged read a rebuild makes;
- ``task_messages``: task delivery (items by id, counts by task state);
- ``ha_messages``: a standby following the primary's WAL, and promotion;
- ``shard_messages``: a queue's head on one shard;
- ``job_messages``: cancelling jobs and keeping schedules;
- ``push_messages``: leases a data node answers on the master's order.

The codec (frame layout, type checks, msgpack) is ``blizzard.wire.codec``; its public
functions are re-exported here too (``encode``/``decode``/``pack``/``unpack``; ``WIRE`` is the
registry of every message, ``op_of`` a class's op code). The master's WAL records
(``master/state/records.py``) are a registry apart.
"""

from __future__ import annotations

from blizzard.wire.codec import (
    MAX_BATCH,
    MAX_FRAME_BYTES,
    MAX_ID,
    MAX_ITEM_BYTES,
    VERSION,
    WIRE,
    Id,
    as_dict,
    decode,
    dumps,
    encode,
    field,
    fields_of,
    iter_loads,
    loads,
    message,
    op_name,
    op_of,
    pack,
    peek_request_id,
    refusal,
    replace,
    unpack,
)
from blizzard.wire.ha_messages import Follow, Promote, Promoted, SnapshotData, WalData
from blizzard.wire.job_messages import (
    DEPENDENCY_CANCEL,
    DEPENDENCY_DEAD,
    FINAL_STATES,
    JOB_STATES,
    NOT_CANCELLED_FINAL,
    NOT_CANCELLED_SCHEDULE,
    NOT_CANCELLED_UNKNOWN,
    RESULT_CANCELLED,
    RESULT_DONE,
    RESULT_FAILED,
    Cancel,
    ListSchedules,
    RemoveSchedule,
    ScheduleInfo,
    ScheduleList,
    ScheduleSpec,
    SetSchedule,
)
from blizzard.wire.meta_messages import ItemMeta, ListMeta, MetaPage
from blizzard.wire.node_messages import (
    BadReplica,
    Blobs,
    CapabilityKey,
    CopyOrder,
    Delete,
    Get,
    GetGrant,
    Heartbeat,
    HeartbeatReply,
    Inventory,
    NodeRef,
    Put,
    PutGrant,
    PutReport,
    Regrant,
    Regranted,
    Replicated,
    Stored,
)
from blizzard.wire.push_messages import AwaitServes, Pushed, ServeOrder, Serves
from blizzard.wire.queue_settings import with_settings
from blizzard.wire.shard_messages import Head, QueueHead
from blizzard.wire.task_messages import Bury, ItemStates, Lookup, TaskCounts, TaskStats

# Re-exported from the codec and the other families (this module's own messages are public too).
__all__ = ["MAX_BATCH", "MAX_FRAME_BYTES", "MAX_ID", "MAX_ITEM_BYTES", "VERSION", "WIRE", "Id",
           "as_dict", "decode", "dumps", "encode", "fields_of", "iter_loads", "loads", "message",
           "op_name", "op_of", "pack", "peek_request_id", "refusal", "replace",
           "unpack"]  # codec.py
__all__ += ["BadReplica", "Blobs", "CapabilityKey", "CopyOrder", "Delete", "Get", "GetGrant",
            "Heartbeat", "HeartbeatReply", "Inventory", "NodeRef", "Put", "PutGrant", "PutReport",
            "Regrant", "Regranted", "Replicated", "Stored"]  # node_messages.py
__all__ += ["ItemMeta", "ListMeta", "MetaPage"]  # meta_messages.py
__all__ += ["Bury", "ItemStates", "Lookup", "TaskCounts", "TaskStats"]  # task_messages.py
__all__ += ["Follow", "Promote", "Promoted", "SnapshotData", "WalData"]  # ha_messages.py
__all__ += ["Head", "QueueHead"]  # shard_messages.py
__all__ += ["AwaitServes", "Pushed", "ServeOrder", "Serves"]  # push_messages.py
__all__ += ["DEPENDENCY_CANCEL", "DEPENDENCY_DEAD", "FINAL_STATES", "JOB_STATES",
            "NOT_CANCELLED_FINAL", "NOT_CANCELLED_SCHEDULE", "NOT_CANCELLED_UNKNOWN",
            "RESULT_CANCELLED", "RESULT_DONE", "RESULT_FAILED", "Cancel", "ListSchedules",
            "RemoveSchedule", "ScheduleInfo", "ScheduleList", "ScheduleSpec",
            "SetSchedule"]  # job_messages.py


# ---------------------------------------------------------------------------------------------
# Shared shapes


@message(1)
class Error:
    """Any server's refusal; the client raises ``errors.from_code(code, message)``."""

    code: str
    message: str


@message(2)
class Ok:
    """A reply that carries nothing but success."""


# ---------------------------------------------------------------------------------------------
# Client -> master


@message(10)
class Place:
    """Ask for ``n`` fresh item ids and the data nodes to store their payloads on.

    A client may hold the ids for a while (one-item enqueues take them one by one) and must
    send their ``Enqueue`` within the placement's ``deadline_s``.
    """

    n: int
    exclude: list[str]  # node ids the client could not reach; placement avoids them


@message(11)
class Placement:
    """Reply to Place: ids ``first .. first + n - 1`` and the nodes to store all of them on.

    ``grant`` lets the client put those ids on those nodes (each ``Put`` carries it).
    """

    first: Id
    n: int
    nodes: list[NodeRef]
    min_replicas: int  # W: the enqueue completes once this many of ``nodes`` hold every id
    deadline_s: float  # seconds the client has to enqueue before the ids are dropped
    grant: PutGrant
    # data nodes the master suspects now (silent past a few heartbeats, or dead): none of them is
    # placed while others can be; a reader tries them last
    suspects: list[str] = field(default_factory=list)

    @property
    def ids(self) -> list[int]:
        return list(range(self.first, self.first + self.n))


@message(45)
class Enqueue:
    """Make items visible once W (``min_replicas``) of their placed nodes report them stored.

    Sent together with the ``Put``s (``report`` set) to the data nodes: the master waits up
    to ``wait_s`` for the nodes' ``PutReport``s, logs the items and answers ``Committed``. With
    ``hold``, the items are kept pending instead and the answer is ``Stored`` (a later
    ``Commit`` makes them visible: ``Client.stage``). Not enough reports in time: ``Unstored``.
    """

    queue: str
    ids: list[Id]
    sizes: list[int]
    crcs: list[int]
    priorities: list[int]
    delays: list[float]  # seconds until each item becomes visible (0: at once)
    keys: list[str]  # "": no key; items sharing a key are never leased at the same time
    coalesce: bool  # a keyed item replaces the waiting items with its key
    request: str  # the caller's id: a retry is answered once, never applied twice
    hold: bool
    wait_s: float
    grant: PutGrant | None  # the placement's: with security on, the ids must be the caller's
    # per item, a unique key in its queue ("": none; []: none at all): an item whose key an
    # earlier item took less than ``unique_for_s`` ago is not made, and ``Committed.firsts``
    # names the earlier one; ``unique_live``: only while that one is queued or leased
    uniques: list[str] = field(default_factory=list)
    unique_for_s: float = 0.0
    unique_live: bool = False
    only_existing: bool = False  # refuse (``UnknownQueue``) rather than create the queue
    # per item, the lease it gets when a consumer names none (beanstalkd's ttr); [] or 0:
    # its queue's lease_s
    ttrs: list[float] = field(default_factory=list)
    # these items are task results: item i is the result of job ``result_of[i]`` (a job id),
    # kept in its queue (``<queue>.results``) until its delay ends; ``result_kind`` says how
    # the job ended (``RESULT_*``): the master links each job to its latest result
    result_of: list[Id] = field(default_factory=list)
    result_kind: int = 0
    # every item waits until these jobs are done; ``on_dependency_failure`` says what one of
    # them ending dead or cancelled does to it (``DEPENDENCY_*``)
    depends_on: list[Id] = field(default_factory=list)
    on_dependency_failure: int = 0
    # results: each job's lease token; only who holds a job's lease stores its result
    result_leases: list[int] = field(default_factory=list)


@message(46)
class Unstored:
    """Reply to Enqueue: ``nodes`` did not report the payloads stored (``error``: why, if known).

    Nothing was made visible; the client avoids those nodes and enqueues again with new ids.
    """

    nodes: list[str]
    error: str


@message(57)
class PutAlso:
    """Reply to Enqueue: ``slow`` placed nodes have not reported the payloads within the master's
    hedge delay; put them on ``nodes`` as well (``grant`` covers the ids there), then send the
    same ``Enqueue`` again. The copies already reported still count, so a write never waits
    on one slow or dead node (docs/design.md, liveness)."""

    nodes: list[NodeRef]
    grant: PutGrant
    slow: list[str]
    suspects: list[str]  # as ``Placement.suspects``


@message(12)
class Commit:
    """Phase 3 of an enqueue: the items are stored on these nodes; make them visible."""

    ids: list[Id]
    stored_on: list[str]  # node ids
    request: str  # the caller's id for this commit: a retry after the items were acked succeeds
    # the put grants of the ids' placements (a secure master commits only staged ids one of
    # them covers: whoever staged them holds their grant)
    grants: list[PutGrant] = field(default_factory=list)


@message(13)
class Committed:
    """Reply to Commit: how many of the ids are now committed (repeats count as committed)."""

    count: int
    # [] when every item was made; else per item of the enqueue, the id that stands for it:
    # its own, or the earlier item that holds its unique key
    firsts: list[Id] = field(default_factory=list)


@message(14)
class Lease:
    """Take up to ``n`` items from the head of ``queue`` for ``lease_s`` seconds;
    ``ack_ids``/``ack_leases`` settle the caller's previous batch in the same round trip."""

    queue: str
    n: int
    lease_s: float
    wait_s: float  # long poll: hold the request up to this long while the queue is empty
    request: str  # the caller's id for this call: a retry gets the same items, not more
    ack_ids: list[Id]
    ack_leases: list[int]
    head: bool = False  # also tell the queue's head after this lease (``Leased.head_*``)
    # lease these, if ready or delayed, not the head (a pause and a rate limit apply alike)
    ids: list[Id] = field(default_factory=list)
    # the routing id of the caller's connections to data nodes (b"": none): a data node may
    # answer this lease, payloads and all (``Pushed``), on the master's order (``Serves``)
    push_to: bytes = b""
    # the caller's secret for that answer: the master signs the ``Leased`` with it, and the
    # caller takes a pushed answer only under that signature (no node can forge one)
    push_key: bytes = b""


@message(15)
class ReplicaSet:
    """The data nodes holding an item, live ones first."""

    nodes: list[NodeRef]


@message(16)
class Leased:
    """Reply to Lease, one column per field (cheap to encode): item i is ids[i], leases[i], ...

    ``replica_set[i]`` indexes ``replica_sets``; ``lost`` lists piggybacked acks whose lease
    had already been lost; ``errors[i]`` is the text of item i's last nack (why it failed,
    shown when it is dead-lettered). ``grant`` lets the client read these ids from these replicas.
    """

    queue: str
    ids: list[Id]
    leases: list[int]  # each lease's token; an ack with a stale token is refused
    sizes: list[int]
    crcs: list[int]
    attempts: list[int]
    priorities: list[int]
    enqueued_at: list[float]
    keys: list[str]  # "": no key
    replica_set: list[int]
    replica_sets: list[ReplicaSet]
    lost: list[Id]
    grant: GetGrant
    errors: list[str]  # the last error a consumer's nack gave each item ("": none)
    head_ready: int = -1  # asked with ``Lease.head``: the queue's head after the lease, as
    head_priority: int = 0  # ``QueueHead``'s fields (-1: not asked)
    head_at: float = 0.0
    head_seq: int = 0
    suspects: list[str] = field(default_factory=list)  # as ``Placement``'s
    ttrs: list[float] = field(default_factory=list)  # each item's own lease ([]: none has one)
    # each item's last progress state (``Extend.states``) saved by an earlier attempt ([]:
    # none has one): a retry resumes from it
    states: list[bytes] = field(default_factory=list)
    # a schedule's item: the tick (unix time) it was armed for ([]: none is one)
    ticks: list[float] = field(default_factory=list)


@message(17)
class Ack:
    """Finish leased items: they are gone for good.

    ``quiet``: the master sends no reply (``Message.ack()``, which does not wait); a refused
    ack is then only counted and logged by the master. ``queue``: the queue every id must be
    in ("": not checked); an id in another queue is refused, not acked.
    """

    ids: list[Id]
    leases: list[int]
    quiet: bool
    queue: str = ""
    # also an item whose lease under this token ran out, if no one leased it since (it
    # waits in its queue): the token's holder may still finish it (SQS's late delete)
    late: bool = False


@message(47)
class Ping:
    """Answered ``Ok`` after the requests sent before it on the same connection are durable."""


@message(18)
class Nack:
    """Give leased items back to their queue (counts as an attempt).

    ``delay_s`` None: visible again after the queue's retry back-off; ``error`` is kept
    with the item (shown when it is dead-lettered).
    """

    ids: list[Id]
    leases: list[int]
    delay_s: float | None
    error: str
    queue: str = ""  # as ``Ack.queue``
    priority: int | None = None  # the items' new priority (beanstalkd's release pri)


@message(25)
class Extend:
    """Keep leased items for ``lease_s`` more seconds (from now)."""

    ids: list[Id]
    leases: list[int]
    lease_s: float
    queue: str = ""  # as ``Ack.queue``
    # progress of some of the items, riding on the extension (``blizzard.progress``): a
    # fraction done (0..1), a note for people, and a state (msgpack bytes) a retry gets back
    progress_ids: list[Id] = field(default_factory=list)
    fractions: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    states: list[bytes] = field(default_factory=list)


# Why an id of an ack, nack or extend was not settled (``Acked.why``, one per ``lost`` id)
LOST_EXPIRED = 0  # not leased under this token: the lease ended, or another lease's ack
LOST_UNKNOWN = 1  # no item has this id (never made, or finished long ago)
LOST_OTHER_QUEUE = 2  # the item is in another queue than the one the request named
LOST_WRONG_TOKEN = 3  # the item is leased under another token


@message(19)
class Acked:
    """Reply to Ack/Nack/Extend: ``done`` ids were settled (or already were); ``lost`` were
    not, each for the reason (``LOST_*``) at the same place in ``why``."""

    done: int
    lost: list[Id]
    why: list[int] = field(default_factory=list)
    cancel: list[Id] = field(default_factory=list)  # to an Extend: these jobs were cancelled


@message(20)
class Stats:
    """Ask for one queue's counters."""

    queue: str


@message(26)
@with_settings()
class QueueSettings:
    """A queue's whole configuration: the fields of ``queue_settings.Settings``, in its order."""


@message(21)
class QueueStats:
    """One queue's counters and configuration."""

    queue: str
    ready: int
    delayed: int
    leased: int
    pending: int
    dead: int  # items of this queue now in its dead-letter queue
    oldest_age_s: float
    enqueued_total: int  # items enqueued since the master started (a restart starts from 0)
    acked_total: int  # items acked since the master started: with the above, rates over time
    settings: QueueSettings
    exists: bool = True  # the master holds the queue (False: never made, or deleted)


@message(27)
@with_settings(optional=True)
class Configure:
    """Create a queue (``create``: refuse if it exists) or change the settings that are not None.

    After ``queue`` and ``create`` come the fields of ``queue_settings.Settings``, in its order.
    """

    queue: str
    create: bool


MAX_QUEUE_PAGE = 1000  # queues in one QueueList, and in ClusterStatus (each reply decodes)


@message(28)
class ListQueues:
    """Ask for the stats of the queues named after ``after``, in name order, at most ``limit``
    of them (0, or more than ``MAX_QUEUE_PAGE``: ``MAX_QUEUE_PAGE``)."""

    after: str = ""
    limit: int = 0


@message(29)
class QueueList:
    """Reply to ListQueues: one page; ``more`` queues follow the last one (ask again with it
    as ``after``)."""

    queues: list[QueueStats]
    more: int = 0


@message(36)
class Purge:
    """Drop every waiting (ready or delayed) item of a queue; leased items are left alone."""

    queue: str


@message(37)
class Peek:
    """The head items of a queue without leasing them (reply: Leased with zero lease tokens).

    ``ids``: these items instead, those of them in ``queue`` (leased ones too, their tokens
    not told); ``delayed``: the delayed items due first instead of the ready head."""

    queue: str
    n: int
    ids: list[Id] = field(default_factory=list)
    delayed: bool = False


@message(38)
class Redrive:
    """Move up to ``n`` dead items of ``queue`` (or of the dead-letter queue named) back.

    ``ids``: only these; a delayed one of them in ``queue`` is made ready now (beanstalkd's
    ``kick-job``)."""

    queue: str
    n: int
    ids: list[Id] = field(default_factory=list)


@message(22)
class Status:
    """Ask for the whole cluster's state."""


@message(23)
class NodeStatus:
    """One data node as the master sees it."""

    node_id: str
    addr: str
    alive: bool
    heartbeat_age_s: float
    items: int
    bytes_used: int
    free_bytes: int
    # alive but suspect: silent a few heartbeats (docs/design.md, L1)
    suspect: bool = field(default=False)


@message(24)
class ClusterStatus:
    """Reply to Status."""

    nodes: list[NodeStatus]
    queues: list[QueueStats]
    under_replicated: int
    replication: int
    secure: bool  # CURVE keys on every socket; False: started with --insecure
    safe_mode: bool  # just started: nothing re-replicated or deleted until the nodes report
    cluster_id: str = ""  # made by the master at its first start; data nodes keep it
    epoch: int = 0  # promotions of a standby so far (master/ha/standby.py)
    standby: str = ""  # the standby every confirmation waits for ("": none in sync)
    queues_more: int = 0  # queues past the first MAX_QUEUE_PAGE by name, not listed here


@message(55)
class Hello:
    """Ask what a client must know before it talks to data nodes."""


@message(56)
class Welcome:
    """Reply to Hello."""

    secure: bool
    node_key: bytes  # the data nodes' CURVE public key (z85); empty when insecure
    role: str  # the role this connection's key has ("" when insecure)
    epoch: int = 0  # raised by every promotion (master/ha/standby.py)
    primary: str = ""  # "": this master is the primary; else the primary it follows or knows
    shard: int = 0  # this master's shard (``blizzard/wire/shard_messages.py``)
    shards: str = ""  # every shard's masters, space-separated, when it was told them
    heads: str = ""  # where it publishes its queues' heads (``master/shard/heads.py``); "": nowhere
    release: str = ""  # the master's release (``blizzard/wire/release.py``); "": before 0.3.0


# ---------------------------------------------------------------------------------------------
# Operator removals (admin key): forget a dead data node, delete an item or a queue


@message(60)
class RemoveNode:
    """Forget a dead data node: its replicas drop out and its items are re-replicated."""

    node_id: str


@message(61)
class DeleteItem:
    """Delete one item of ``queue`` (or a dead item that came from it) for good.

    A leased item is refused unless ``force``.
    """

    queue: str
    id: Id
    force: bool


@message(62)
class DeleteQueue:
    """Delete a queue, its settings and its items; a queue with items is refused unless
    ``force``."""

    queue: str
    force: bool


@message(63)
class Removed:
    """Reply to the removals: how many items went (or, for a node, lost a replica)."""

    count: int


# ---------------------------------------------------------------------------------------------
# Jobs: how a job is doing and its result (master/jobs/status.py; the rest is job_messages.py)

@message(64)
class Jobs:
    """Ask how jobs (items, by id) are doing, with a grant to read their results.

    ``wait_s``: hold the answer until every one of them is final (done, dead, cancelled or
    unknown), up to that long (``handle.result()`` waits so, without polling)."""

    ids: list[Id]
    wait_s: float = 0.0


@message(65)
class JobStates:
    """Reply to Jobs, one column per field: job i is ids[i], states[i], ...

    ``runs``: the results its runs stored (2: it ran twice, at least once being at least
    once); ``cancel_requested``: a cancel came while it ran; ``progress``/``notes``: its
    last progress (-1: none). ``results`` describes the result items kept (with a grant to
    read them from the data nodes); ``result_of[k]`` is the job whose result is
    ``results.ids[k]``."""

    ids: list[Id]
    states: list[str]
    queues: list[str]
    attempts: list[int]
    runs: list[int]
    errors: list[str]
    cancel_requested: list[bool]
    progress: list[float]
    notes: list[str]
    results: Leased
    result_of: list[Id]
    schedules: list[str] = field(default_factory=list)  # a schedule's job: its name ([]: none)


@message(87)
class InProgress:
    """The running jobs that reported progress, up to ``limit`` (the status page's). Reply
    ``JobStates``."""

    limit: int


