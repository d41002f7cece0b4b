"""Every message Blizzard sends, and the only code that turns them into bytes.

Frame layout (ZeroMQ): a client's DEALER socket sends one frame, the body; a server's ROUTER
socket sees ``[peer identity, body]`` and replies on the same identity with one body.

Body: a msgpack array ``[VERSION, op, request_id, field_1, ..., field_n]``. ``op`` is the
message's small integer code, ``request_id`` a non-negative integer the reply repeats so a
client may keep many requests in flight. Fields follow the dataclass's field order; a nested
message (e.g. ``NodeRef``) travels as a plain array of its fields. Every field is checked
against its declared type on decode, so a handler only ever sees well-typed messages.

The master's WAL records (``master/records.py``) use the same registry and ``pack``/``unpack``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Callable, Iterator

import msgpack

from blizzard.errors import ProtocolError, UnknownOp, VersionMismatch

VERSION = 1
MAX_BATCH = 10_000  # items in one request
MAX_FRAME_BYTES = 256 * 1024 * 1024  # ZMQ_MAXMSGSIZE on every socket

_BY_OP: dict[int, type] = {}
_OP_OF: dict[type, int] = {}
_CHECKERS: dict[type, Callable[[Any], Any]] = {}


def message(op: int) -> Callable[[type], type]:
    """Class decorator: make a frozen dataclass a wire message with code ``op``."""

    def wrap(cls: type) -> type:
        cls = dataclasses.dataclass(frozen=True, slots=True)(cls)
        if op in _BY_OP:
            raise RuntimeError(f"op {op} used twice: {_BY_OP[op].__name__} and {cls.__name__}")
        _BY_OP[op] = cls
        _OP_OF[cls] = op
        return cls

    return wrap


def _checker(tp: Any) -> Callable[[Any], Any]:
    """Build a function that validates (and normalises) a decoded value of type ``tp``."""
    origin = typing.get_origin(tp)
    if tp is int:
        def check_int(v: Any) -> int:
            if type(v) is not int:
                raise ProtocolError(f"expected an integer, got {type(v).__name__}")
            return v
        return check_int
    if tp is float:
        def check_float(v: Any) -> float:
            if type(v) is float or type(v) is int:
                return float(v)
            raise ProtocolError(f"expected a number, got {type(v).__name__}")
        return check_float
    if tp is bool:
        def check_bool(v: Any) -> bool:
            if type(v) is not bool:
                raise ProtocolError(f"expected a boolean, got {type(v).__name__}")
            return v
        return check_bool
    if tp is str or tp is bytes:
        def check_plain(v: Any) -> Any:
            if type(v) is not tp:
                raise ProtocolError(f"expected {tp.__name__}, got {type(v).__name__}")
            return v
        return check_plain
    if origin is list:
        (inner,) = typing.get_args(tp)
        check_inner = _checker(inner)
        if inner is float:
            def check_float_list(v: Any) -> list:
                if type(v) is not list:
                    raise ProtocolError(f"expected an array, got {type(v).__name__}")
                for x in v:
                    if type(x) is not float and type(x) is not int:
                        raise ProtocolError(f"expected number elements, got {type(x).__name__}")
                return v
            return check_float_list
        if inner in (int, str, bytes):
            def check_plain_list(v: Any) -> list:
                if type(v) is not list:
                    raise ProtocolError(f"expected an array, got {type(v).__name__}")
                if len(v) > MAX_BATCH * 4:
                    raise ProtocolError(f"array of {len(v)} elements is too long")
                for x in v:
                    if type(x) is not inner:
                        raise ProtocolError(f"expected {inner.__name__} elements, got {type(x).__name__}")
                return v
            return check_plain_list

        def check_list(v: Any) -> list:
            if type(v) is not list:
                raise ProtocolError(f"expected an array, got {type(v).__name__}")
            if len(v) > MAX_BATCH * 4:
                raise ProtocolError(f"array of {len(v)} elements is too long")
            return [check_inner(x) for x in v]
        return check_list
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        (inner,) = args
        check_inner = _checker(inner)
        return lambda v: None if v is None else check_inner(v)
    if dataclasses.is_dataclass(tp):
        return lambda v: _from_fields(tp, v)
    raise TypeError(f"unsupported wire type {tp!r}")


def _field_checkers(cls: type) -> Callable[[Any], Any]:
    checker = _CHECKERS.get(cls)
    if checker is None:
        hints = typing.get_type_hints(cls)
        names = [f.name for f in dataclasses.fields(cls)]
        checks = [_checker(hints[n]) for n in names]
        count = len(names)

        def checker(values: Any) -> Any:
            if type(values) is not list or len(values) != count:
                raise ProtocolError(f"{cls.__name__} takes {count} fields")
            return cls(*[c(v) for c, v in zip(checks, values)])

        _CHECKERS[cls] = checker
    return checker


def _from_fields(cls: type, values: Any) -> Any:
    try:
        return _field_checkers(cls)(values)
    except ProtocolError as exc:
        raise ProtocolError(f"{cls.__name__}: {exc.message}") from None


def _to_fields(msg: Any) -> list:
    out = []
    for f in dataclasses.fields(msg):
        v = getattr(msg, f.name)
        if dataclasses.is_dataclass(v):
            v = _to_fields(v)
        elif type(v) is list and v and dataclasses.is_dataclass(v[0]):
            v = [_to_fields(x) for x in v]
        out.append(v)
    return out


def encode(request_id: int, msg: Any) -> bytes:
    """Serialise a message (reply or request) with its request id into one frame body."""
    op = _OP_OF[type(msg)]
    return msgpack.packb([VERSION, op, request_id, *_to_fields(msg)], use_bin_type=True)


def peek_request_id(body: bytes) -> int | None:
    """Best-effort request id of a body that failed to decode, so the error can be routed."""
    try:
        raw = msgpack.unpackb(body, raw=False, strict_map_key=True)
        rid = raw[2]
        return rid if type(rid) is int else None
    except Exception:
        return None


def decode(body: bytes) -> tuple[int, Any]:
    """Parse and type-check one frame body; raise ``ProtocolError`` (or a subclass) if it is bad."""
    try:
        raw = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:
        raise ProtocolError(f"body is not valid msgpack: {exc}") from None
    if type(raw) is not list or len(raw) < 3:
        raise ProtocolError("body must be an array [version, op, request_id, ...]")
    version, op, rid = raw[0], raw[1], raw[2]
    if version != VERSION:
        raise VersionMismatch(f"protocol version {version!r} is not {VERSION}")
    if type(rid) is not int or rid < 0:
        raise ProtocolError("request id must be a non-negative integer")
    cls = _BY_OP.get(op) if type(op) is int else None
    if cls is None:
        raise UnknownOp(f"unknown op {op!r}")
    return rid, _from_fields(cls, raw[3:])


def pack(msg: Any) -> bytes:
    """Serialise a registered message without a request id (used for WAL records)."""
    return msgpack.packb([_OP_OF[type(msg)], *_to_fields(msg)], use_bin_type=True)


def unpack(body: bytes) -> Any:
    """Inverse of ``pack``; raises ``ProtocolError`` on anything malformed."""
    try:
        raw = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:
        raise ProtocolError(f"record is not valid msgpack: {exc}") from None
    if type(raw) is not list or not raw or type(raw[0]) is not int or raw[0] not in _BY_OP:
        raise ProtocolError("record has no known type")
    return _from_fields(_BY_OP[raw[0]], raw[1:])


def dumps(obj: Any) -> bytes:
    """Serialise plain data (lists, dicts, numbers, strings, bytes), e.g. a checkpoint body."""
    return msgpack.packb(obj, use_bin_type=True)


def loads(body: bytes) -> Any:
    """Inverse of ``dumps``; raises ``ProtocolError`` on malformed input."""
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=False, use_list=True)
    except Exception as exc:
        raise ProtocolError(f"not valid msgpack: {exc}") from None


def iter_loads(body: bytes) -> Iterator[Any]:
    """The msgpack objects stored one after another in ``body`` (see ``dumps``)."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, use_list=True,
                                max_buffer_size=max(len(body), 1024))
    unpacker.feed(body)
    try:
        yield from unpacker
    except Exception as exc:
        raise ProtocolError(f"not valid msgpack: {exc}") from None


def op_name(msg: Any) -> str:
    return type(msg).__name__


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


@message(3)
class NodeRef:
    """Where a data node is: its stable id and the address clients and peers connect to."""

    node_id: str
    addr: str


# ---------------------------------------------------------------------------------------------
# Client -> master


@message(10)
class Alloc:
    """Phase 1 of an enqueue: ask for ids and a placement for a batch of items."""

    queue: str
    sizes: list[int]
    crcs: list[int]
    priorities: list[int]
    delays: list[float]  # seconds until each item becomes visible (0: at once)
    keys: list[str]  # "": no key; items sharing a key are never leased at the same time
    coalesce: bool  # a keyed item replaces the waiting items with its key
    exclude: list[str]  # node ids the client could not reach; placement avoids them


@message(11)
class Placement:
    """Reply to Alloc: item ids (in request order) and the nodes to store all of them on."""

    ids: list[int]
    nodes: list[NodeRef]
    min_copies: int
    deadline_s: float  # seconds the client has to commit before the pending enqueue is dropped


@message(12)
class Commit:
    """Phase 3 of an enqueue: the items are stored on these nodes; make them visible."""

    ids: list[int]
    stored_on: list[str]  # node ids
    request: str  # the caller's id for this commit: a retry after the items were acked succeeds


@message(13)
class Committed:
    """Reply to Commit: how many of the ids are now committed (repeats count as committed)."""

    count: int


@message(14)
class Lease:
    """Take up to ``n`` items from the head of ``queue`` for ``lease_s`` seconds.

    ``ack_ids``/``ack_leases`` settle the caller's previous batch in the same round trip.
    """

    queue: str
    n: int
    lease_s: float
    wait_s: float  # long poll: hold the request up to this long while the queue is empty
    request: str  # the caller's id for this call: a retry gets the same items, not more
    ack_ids: list[int]
    ack_leases: list[int]


@message(15)
class ReplicaSet:
    """The data nodes holding an item, live ones first."""

    nodes: list[NodeRef]


@message(16)
class Leased:
    """Reply to Lease, one column per field (cheap to encode): item i is ids[i], leases[i], ...

    ``replica_set[i]`` indexes ``replica_sets``; ``lost`` lists piggybacked acks whose lease
    had already been lost.
    """

    queue: str
    ids: list[int]
    leases: list[int]  # each lease's token; an ack with a stale token is refused
    sizes: list[int]
    crcs: list[int]
    attempts: list[int]
    priorities: list[int]
    enqueued_at: list[float]
    keys: list[str]  # "": no key
    replica_set: list[int]
    replica_sets: list[ReplicaSet]
    lost: list[int]


@message(17)
class Ack:
    """Finish leased items: they are gone for good."""

    ids: list[int]
    leases: list[int]


@message(18)
class Nack:
    """Give leased items back to their queue (counts as an attempt).

    ``delay_s`` None: visible again after the queue's retry back-off; ``error`` is kept
    with the item (shown when it is dead-lettered).
    """

    ids: list[int]
    leases: list[int]
    delay_s: float | None
    error: str


@message(25)
class Extend:
    """Keep leased items for ``lease_s`` more seconds (from now)."""

    ids: list[int]
    leases: list[int]
    lease_s: float


@message(19)
class Acked:
    """Reply to Ack/Nack: ``done`` ids were settled (or already were); ``lost`` had lost their lease."""

    done: int
    lost: list[int]


@message(20)
class Stats:
    """Ask for one queue's counters."""

    queue: str


@message(26)
class QueueSettings:
    """A queue's configuration (see ``master/queues.py`` for meanings and defaults)."""

    lease_s: float
    max_attempts: int
    dead_letter: str
    backoff_base_s: float
    backoff_cap_s: float
    rate_per_s: float
    burst: int


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
    settings: QueueSettings


@message(27)
class Configure:
    """Create a queue (``create``: refuse if it exists) or change some of its settings."""

    queue: str
    create: bool
    lease_s: float | None
    max_attempts: int | None
    dead_letter: str | None
    backoff_base_s: float | None
    backoff_cap_s: float | None
    rate_per_s: float | None
    burst: int | None


@message(28)
class ListQueues:
    """Ask for every queue's stats."""


@message(29)
class QueueList:
    """Reply to ListQueues."""

    queues: list[QueueStats]


@message(36)
class Purge:
    """Drop every waiting (ready or delayed) item of a queue; leased items are left alone."""

    queue: str


@message(37)
class Peek:
    """The head items of a queue without leasing them (reply: Leased with zero lease tokens)."""

    queue: str
    n: int


@message(38)
class Redrive:
    """Move up to ``n`` dead items of ``queue`` (or of the dead-letter queue named) back."""

    queue: str
    n: int


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


@message(24)
class ClusterStatus:
    """Reply to Status."""

    nodes: list[NodeStatus]
    queues: list[QueueStats]
    under_replicated: int
    replication: int


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


@message(31)
class HeartbeatReply:
    """The master's commands for a data node: blobs to delete, blobs to copy, send inventory."""

    delete: list[int]
    copies: list[CopyOrder]
    inventory: bool  # the master wants this node's full list of blob ids


@message(32)
class CopyOrder:
    """Copy these blobs to ``target`` (re-replication), then report with ``Replicated``."""

    target: NodeRef
    ids: list[int]


@message(33)
class Replicated:
    """A data node copied ``ids`` to ``target``; ``missing`` were absent or corrupt at the source."""

    node_id: str
    target: str
    ids: list[int]
    missing: list[int]


@message(34)
class Inventory:
    """A chunk of a data node's blob ids; ``done`` marks the last chunk."""

    node_id: str
    ids: list[int]
    done: bool


@message(35)
class BadReplica:
    """A client found these replicas missing or failing their checksum (parallel lists)."""

    ids: list[int]
    node_ids: list[str]


# ---------------------------------------------------------------------------------------------
# Client -> data node


@message(40)
class Put:
    """Phase 2 of an enqueue: store these blobs durably (checksums are CRC-32 of each blob)."""

    ids: list[int]
    blobs: list[bytes]
    crcs: list[int]
    forward: list[NodeRef]  # other replicas this node passes the blobs to
    min_copies: int  # reply only when this many nodes (this one included) hold every blob
    node_id: str  # the node meant to store them: a new node at a dead one's address refuses


@message(41)
class Stored:
    """Reply to Put: the node ids that durably hold every blob (fewer than asked if replicas failed)."""

    nodes: list[str]


@message(42)
class Get:
    """Read blobs by id."""

    ids: list[int]


@message(43)
class Blobs:
    """Reply to Get: blobs found intact, in request order; ``missing`` lists ids absent or corrupt."""

    ids: list[int]
    blobs: list[bytes]
    crcs: list[int]
    missing: list[int]


@message(44)
class Delete:
    """Drop blobs by id (unknown ids are ignored)."""

    ids: list[int]
