"""The codec behind ``blizzard.wire.protocol``: message classes, frames, compiled msgpack.

Frame layout (ZeroMQ): a client's DEALER socket sends one frame, the body; a server's ROUTER
socket sees ``[peer identity, body]`` and replies on the same identity with one body.

Body (wire version 2): the msgpack array ``[VERSION, request_id, message]``; ``request_id`` is
a non-negative 64-bit integer the reply repeats, so a client may keep many requests in flight;
``message`` is the array ``[op, field_1, ..., field_n]``: the message's small integer code,
then its fields in declaration order. A nested message (``NodeRef`` in a ``Placement``) is
such an array too. Version 1 (the release of 2026-11) put ``op`` and the request id side by
side, ``[1, op, request_id, field_1, ...]``, and nested messages without their op; a frame of
the other version is refused with an error naming both and the upgrade order, in the layout
that peer reads (``refusal``).

Every message class is a frozen msgspec ``Struct`` (``@message(op)``): one typed decoder per
process checks every field against its declared type while it decodes, in C, so a handler
only ever sees well-typed messages. Item ids are 0..2**63-1, every array holds at most
``MAX_ARRAY`` elements (checked at its header, before anything is allocated), a map or an ext
value in a field is refused, and the fields of a frame whose arrays hold messages holding
arrays hold at most ``MAX_ELEMENTS`` array elements (in a large frame, those fields are walked
and counted first, their blobs skipped). Whatever msgspec raises on a bad body is a
``ProtocolError``.
A field added in a later release goes last, with a default: an older peer skips the element
unread, and a frame without it decodes to the default.

This module and ``protocol`` (which defines every message with ``@message``) are the only
places that know the bytes; nothing else calls msgpack. The WAL's records are dataclasses with
a codec of their own (``checked.py``), so that what an older release wrote reads unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypeVar

import msgpack
import msgspec
from msgspec import Meta

from blizzard.wire.errors import ProtocolError, UnknownOp, VersionMismatch

VERSION = 2
UPGRADE_ORDER = ("wire versions 1 and 2 do not mix: stop the cluster, start its data nodes, "
                 "standby and master on the new release (they keep their data), then upgrade "
                 "every client (docs/operations.md, Upgrades)")
MAX_BATCH = 10_000  # items in one request
# The largest legal frame: a put of a 16 MiB chunk plus one item of up to 16 MiB, with its
# ids and checksums; also the largest reply (a data node caps a read's reply below it).
# ZMQ_MAXMSGSIZE on data nodes and clients; kept below the WAL's record limit (64 MiB).
MAX_FRAME_BYTES = 40 * 1024 * 1024
MAX_ITEM_BYTES = 16 * 1024 * 1024  # the largest item any configuration may allow
MAX_ID = 2**63 - 1  # item ids are non-negative and fit a signed 64-bit integer
MAX_ARRAY = MAX_BATCH * 4 + 16  # elements in any one array
# Python objects one frame may decode into: a legal frame needs a few columns of MAX_BATCH
# elements; a hostile one of tiny nested arrays would otherwise cost ~70 bytes per byte.
MAX_ELEMENTS = MAX_BATCH * 16

M = TypeVar("M")  # a message class

Id = Annotated[int, Meta(ge=0, le=MAX_ID)]  # an item id on the wire
field = msgspec.field  # a message field's default: ``field(default_factory=list)``

_ALL_OPS: dict[int, type] = {}  # every registered class, of any family, by op code
_BY_OP: dict[int, type] = {}  # wire messages by op code
_TYPED: set[type] = set()  # message classes whose field types are final (``_finish``)
# ops whose shape nests arrays in messages in arrays (a Put's metadata groups, say): a large
# frame of one has the elements of those fields counted before it is decoded (``_count_deep``)
_DEEP: set[int] = set()
# per deep op: a decoder of its fields as raw spans, and which fields nest (``_spans_of``)
_SPANS: dict[int, tuple[msgspec.msgpack.Decoder[Any], tuple[str, ...]]] = {}
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def claim_op(op: int, cls: type) -> None:
    """Reserve ``op`` for ``cls``: codes are unique across the wire and the WAL's records."""
    if op in _ALL_OPS:
        raise RuntimeError(f"op {op} used twice ({cls.__name__}, {_ALL_OPS[op].__name__})")
    _ALL_OPS[op] = cls


class _Wire:
    """The wire family: ``by_op`` (code -> class), as the WAL's ``Registry`` has it."""

    what = "message"
    by_op = _BY_OP


WIRE = _Wire()


def _bounded(tp: Any) -> Any:
    """``tp`` with every array limited to ``MAX_ARRAY`` elements (checked before decoding)."""
    origin = typing.get_origin(tp)
    if origin is list:
        (inner,) = typing.get_args(tp)
        return Annotated[list[_bounded(inner)], Meta(max_length=MAX_ARRAY)]  # type: ignore[misc]
    if origin in (typing.Union, types.UnionType):
        # a Union of a tuple made at run time, which ``X | Y`` cannot spell
        return typing.Union[tuple(_bounded(a) for a in typing.get_args(tp))]  # noqa: UP007
    return tp


@typing.dataclass_transform(frozen_default=True, field_specifiers=(msgspec.field,))
def message(op: int) -> Callable[[type[M]], type[M]]:
    """Class decorator: make a class with annotated fields a wire message with code ``op``.

    The class becomes a frozen, array-like msgspec ``Struct`` tagged ``op``, with the same
    name, fields (in order), defaults, methods and properties.
    """

    def wrap(cls: type[M]) -> type[M]:
        own = list(cls.__dict__.get("__annotations__", {}))
        body = {k: v for k, v in cls.__dict__.items() if k not in ("__dict__", "__weakref__")}
        for name in own:
            if isinstance(body.get(name), dataclasses.Field):
                raise TypeError(f"{cls.__name__}.{name}: use codec.field, not dataclasses.field")
        struct = types.new_class(cls.__name__, (msgspec.Struct,),
                                 dict(frozen=True, array_like=True, tag=op, gc=False),
                                 lambda ns: ns.update(body))
        claim_op(op, struct)
        _BY_OP[op] = struct
        _FIELD_NAMES[struct] = tuple(own)
        _DECODERS.clear()
        return typing.cast("type[M]", struct)

    return wrap


def _finish() -> None:
    """Give every message class its checked field types (arrays bounded) and its bound.

    Run before a decoder is built, when every message module has loaded: a message may name
    a class defined after it. msgspec reads a class's types when a decoder first needs them.
    """
    for cls in _BY_OP.values():
        if cls not in _TYPED:
            hints = typing.get_type_hints(cls, include_extras=True)
            names = _FIELD_NAMES[cls]
            type.__setattr__(cls, "__annotations__", {n: _bounded(hints[n]) for n in names})
            _TYPED.add(cls)
    _DEEP.clear()
    _DEEP.update(op for op, cls in _BY_OP.items() if _nests(cls, 0) >= 2)
    _SPANS.clear()


def _nests(tp: Any, depth: int) -> int:
    """How many arrays deep a value of type ``tp`` may hold arrays (0: none)."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _nests(typing.get_args(tp)[0], depth)
    if origin is list:
        return _nests(typing.get_args(tp)[0], depth + 1)
    if origin in (typing.Union, types.UnionType):
        return max(_nests(a, depth) for a in typing.get_args(tp))
    if tp in _FIELD_NAMES:
        hints = typing.get_type_hints(tp, include_extras=True)
        return max([depth] + [_nests(hints[n], depth) for n in _FIELD_NAMES[tp]])
    return depth


def as_ids(values: list[int]) -> list[int]:
    """``values`` (the same list) as item ids for a message; the receiver checks each."""
    return values


def op_of(cls: type) -> int:
    """The op code a message or WAL record class was registered with."""
    for op, known in _ALL_OPS.items():
        if known is cls:
            return op
    raise KeyError(cls.__name__)


def op_name(msg: Any) -> str:
    return type(msg).__name__


def fields_of(cls: type) -> tuple[str, ...]:
    """A message class's field names, in wire order."""
    return _FIELD_NAMES[cls]


@functools.cache
def id_fields(cls: type) -> frozenset[str]:
    """The fields of a message class that hold item ids (``Id``, or arrays of them)."""
    _finish()
    hints = typing.get_type_hints(cls, include_extras=True)

    def holds_id(tp: Any) -> bool:
        return tp == Id or any(holds_id(a) for a in typing.get_args(tp) if not isinstance(a, Meta))

    return frozenset(n for n in _FIELD_NAMES[cls] if holds_id(hints[n]))


def replace(msg: M, **changes: Any) -> M:
    """A copy of message ``msg`` with ``changes`` (messages are frozen)."""
    return typing.cast(M, msgspec.structs.replace(typing.cast(msgspec.Struct, msg), **changes))


def as_dict(msg: Any) -> dict[str, Any]:
    """A message's fields by name (nested messages stay messages)."""
    return msgspec.structs.asdict(msg)


def brief(v: Any) -> str:
    """A short, safe description of a decoded value for an error message.

    Never ``repr`` a hostile value whole: a deeply nested array makes ``repr`` recurse past
    the interpreter's limit, and a long one makes a huge message.
    """
    if v is None or type(v) in (bool, int, float):
        text = repr(v)
        return text if len(text) <= 40 else text[:37] + "..."
    if type(v) is str:
        return repr(v[:40]) + ("..." if len(v) > 40 else "")
    return f"a value of type {type(v).__name__}"


# ---------------------------------------------------------------------------------------------
# Frames

_ENCODER = msgspec.msgpack.Encoder()  # holds no state between calls: shared by every thread
# What a hostile body can make msgspec raise besides its own errors: bad UTF-8 in a string,
# nesting past the recursion limit in an element it skips (a field from a later release)
_UNDECODABLE = (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, RecursionError,
                ValueError, OverflowError)
_DECODERS: dict[str, msgspec.msgpack.Decoder[Any]] = {}  # rebuilt when a message is added
_RID = Annotated[int, Meta(ge=0, le=MAX_ID)]


def _decoder(kind: str) -> msgspec.msgpack.Decoder[Any]:
    _finish()
    messages: Any = typing.Union[tuple(_BY_OP.values())]  # noqa: UP007 (as in _bounded)
    if kind == "frame":
        decoder = msgspec.msgpack.Decoder(tuple[int, _RID, messages])
    else:
        decoder = msgspec.msgpack.Decoder(messages)
    _DECODERS[kind] = decoder
    return decoder


def encode(request_id: int, msg: Any) -> bytes:
    """Serialise a message (reply or request) with its request id into one frame body."""
    return _ENCODER.encode((VERSION, request_id, msg))


def decode(body: bytes) -> tuple[int, Any]:
    """Parse and type-check one frame body; raise ``ProtocolError`` (or a subclass) if it is bad."""
    decoder = _DECODERS.get("frame") or _decoder("frame")
    if len(body) > MAX_ELEMENTS:
        head = _Prefix(body)
        if head.version != VERSION:
            return _undecodable(body, ProtocolError("not this version"))
        if head.op in _DEEP:
            _count_deep(body, head.op)
    try:
        version, rid, msg = decoder.decode(body)
    except _UNDECODABLE as exc:
        return _undecodable(body, exc)
    if version != VERSION:
        raise VersionMismatch(_mismatch(version), peer_version=version)
    return rid, msg


def pack(msg: Any) -> bytes:
    """Serialise a message without a request id: ``[op, field_1, ...]`` (stored metadata, a
    published head)."""
    return _ENCODER.encode(msg)


def unpack(body: bytes) -> Any:
    """Inverse of ``pack``; raises ``ProtocolError`` on anything malformed."""
    decoder = _DECODERS.get("message") or _decoder("message")
    try:
        return decoder.decode(body)
    except _UNDECODABLE as exc:
        raise ProtocolError(f"message is not valid: {_readable(exc, None)}") from None


def _mismatch(version: int) -> str:
    return f"a process of wire version {version} met one of wire version {VERSION}: {UPGRADE_ORDER}"


def _readable(exc: Exception, cls: type | None) -> str:
    """msgspec's error with a field's name for its position (``$[2][3]`` -> ``ids``)."""
    text = str(exc)[:300]
    if cls is None:
        return text
    names = _FIELD_NAMES[cls]

    ids = id_fields(cls)
    named: list[str] = []

    def name(match: re.Match[str]) -> str:
        k = int(match.group(1)) - 1
        if not 0 <= k < len(names):
            return match.group(0)
        named.append(names[k])
        return f"field {names[k]}{match.group(2) or ''}"

    text = re.sub(r"`\$\[2\]\[(\d+)\]((?:\[\d+\])*)`", name, text)
    if named and named[0] in ids:
        text += f" (an item id is 0..{MAX_ID})"
    return text


def _undecodable(body: bytes, exc: Exception) -> tuple[int, Any]:
    """Why ``body`` did not decode, as the right ``ProtocolError``; a version 1 peer's refusal
    decodes, so that the call it answers fails with it rather than waiting."""
    head = _Prefix(body)
    if head.count is None:
        raise ProtocolError(f"body is not a msgpack array [version, request_id, message]: "
                            f"{_readable(exc, None)}") from None
    if head.version is None:
        raise ProtocolError("body must start with a protocol version") from None
    if head.version != VERSION:
        refused = head.v1_refusal()
        if refused is not None:
            rid, text = refused
            return rid, _BY_OP[1](code=VersionMismatch.code,
                                  message=f"{_mismatch(1)}; it said: {text}")
        raise VersionMismatch(_mismatch(head.version), peer_version=head.version) from None
    if head.count != 3 or head.rid is None:
        raise ProtocolError("body must be [version, request_id, message] with a request id "
                            "of 0..2**63-1") from None
    cls = _BY_OP.get(head.op) if head.op is not None else None
    if cls is None:
        raise UnknownOp(f"unknown op {brief(head.op)}" if head.op is not None
                        else "message must be an array [op, field_1, ...]") from None
    raise ProtocolError(f"{cls.__name__}: {_readable(exc, cls)}") from None


def peek_request_id(body: bytes) -> int | None:
    """Best-effort request id of a body that failed to decode, so the error can be routed.

    Only a request id a client could have sent (non-negative, 64-bit) is returned: echoing
    anything else would make a reply the client cannot decode. A version 1 body has it third.
    """
    head = _Prefix(body)
    return head.rid


def refusal(body: bytes, exc: VersionMismatch) -> bytes:
    """The reply to a request of another wire version, in the layout that version reads."""
    head = _Prefix(body)
    if head.version == 1:  # [1, op, rid, fields...]: Error is op 1 with (code, message)
        reply: bytes = msgpack.packb([1, 1, head.rid or 0, exc.code, exc.message])
        return reply
    return encode(head.rid or 0, _BY_OP[1](code=exc.code, message=exc.message))


class _Prefix:
    """The leading integers of a body, read by hand: no hostile value is ever decoded whole.

    ``count``: elements of the outer array (None: not an array); ``version``; ``rid`` (a
    valid request id, else None) and ``op`` of a current body, or of a version 1 body
    ``[1, op, rid, ...]``.
    """

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.version: int | None = None
        self.rid: int | None = None
        self.op: int | None = None
        self._fields_at = 0
        self.count, at = _array_header(body, 0)
        if self.count is None or self.count < 1:
            return
        self.version, at = _int_at(body, at)
        if self.version == 1 and self.count >= 3:  # [1, op, rid, ...]
            self.op, at = _int_at(body, at)
            rid, self._fields_at = _int_at(body, at)
            self.rid = rid if rid is not None and 0 <= rid <= MAX_ID else None
            return
        if self.count >= 2:
            rid, at = _int_at(body, at)
            self.rid = rid if rid is not None and 0 <= rid <= MAX_ID else None
            if self.count >= 3 and rid is not None:
                n, at = _array_header(body, at)
                if n:
                    self.op, _ = _int_at(body, at)

    def v1_refusal(self) -> tuple[int, str] | None:
        """(request id, text) if this is a version 1 peer's ``Error`` reply."""
        if self.version != 1 or self.op != 1 or self.rid is None or self.count != 5:
            return None
        try:
            unpacker = msgpack.Unpacker(max_buffer_size=len(self.body) + 1, max_array_len=8,
                                        max_map_len=0, max_str_len=4096)
            unpacker.feed(self.body[self._fields_at:])
            code, text = unpacker.unpack(), unpacker.unpack()
        except Exception:
            return None
        if type(code) is not str or type(text) is not str:
            return None
        return self.rid, f"{brief(code)}: {text[:300]}"


def _array_header(body: bytes, at: int) -> tuple[int | None, int]:
    if at >= len(body):
        return None, at
    b = body[at]
    if 0x90 <= b <= 0x9F:
        return b & 0x0F, at + 1
    if b == 0xDC and at + 3 <= len(body):
        return int.from_bytes(body[at + 1:at + 3], "big"), at + 3
    if b == 0xDD and at + 5 <= len(body):
        return int.from_bytes(body[at + 1:at + 5], "big"), at + 5
    return None, at


_UINT_WIDTH = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}


def _int_at(body: bytes, at: int) -> tuple[int | None, int]:
    """A non-negative msgpack integer at ``at`` and the position after it (None: not one)."""
    if at >= len(body):
        return None, at
    b = body[at]
    if b <= 0x7F:
        return b, at + 1
    width = _UINT_WIDTH.get(b)
    if width is None or at + 1 + width > len(body):
        return None, at
    return int.from_bytes(body[at + 1:at + 1 + width], "big"), at + 1 + width


def _count_deep(body: bytes, op: int) -> None:
    """``ProtocolError`` if the fields of a large frame that nest arrays in arrays hold more
    than ``MAX_ELEMENTS`` array elements.

    Typed decoding bounds each array (``MAX_ARRAY``), so a field of scalars, or of messages
    without arrays, decodes into a bounded number of objects. A field whose arrays hold
    messages holding arrays (a ``Put``'s metadata groups) could still decode into some 20
    bytes of memory per byte: those fields are walked in Python, their strings and blobs
    skipped by their lengths and never copied. The frame is first split into its fields' byte
    spans in C (``_spans_of``), so the other columns of a large reply (a ``Leased``'s ten
    thousand ids, sizes and checksums) are never visited one by one. A frame that does not
    split is walked whole.
    """
    decoder, deep = _SPANS.get(op) or _spans_of(op)
    try:
        _, _, spans = decoder.decode(body)
    except _UNDECODABLE:
        _count_elements(body)
        return
    budget = MAX_ELEMENTS
    for name in deep:
        budget = _count_elements(bytes(getattr(spans, name)), budget)


def _spans_of(op: int) -> tuple[msgspec.msgpack.Decoder[Any], tuple[str, ...]]:
    """A decoder of op's frames into the raw bytes of each field, and the fields that nest."""
    cls = _BY_OP[op]
    names = _FIELD_NAMES[cls]
    hints = typing.get_type_hints(cls, include_extras=True)
    shape = msgspec.defstruct(f"{cls.__name__}Spans",
                              [(n, msgspec.Raw, msgspec.field(default_factory=msgspec.Raw))
                               for n in names], array_like=True, tag=op)
    frame: Any = tuple[msgspec.Raw, msgspec.Raw, shape]  # type: ignore[valid-type]
    decoder = msgspec.msgpack.Decoder(frame)
    _SPANS[op] = decoder, tuple(n for n in names if _nests(hints[n], 0) >= 2)
    return _SPANS[op]


def _count_elements(body: bytes, budget: int = MAX_ELEMENTS) -> int:
    """Walk one msgpack value (a whole frame, or a field's span) and count its array
    elements; ``ProtocolError`` once they pass ``budget``; what is left of it."""
    at, pending, end = 0, 1, len(body)
    while pending:  # the values still to read; each array adds its elements
        if at >= end:
            return budget  # truncated: the typed decode says how
        b = body[at]
        pending -= 1
        if 0x90 <= b <= 0x9F or b in (0xDC, 0xDD):
            n, at = _array_header(body, at)
            if n is None:
                return budget
            budget -= n + 1
            if budget < 0:
                raise ProtocolError(f"more than {MAX_ELEMENTS} array elements in one frame")
            pending += n
            continue
        skip = _skip_of(body, at)
        if skip is None:
            return budget  # a map, an ext or a reserved byte: the typed decode refuses it
        at = skip
    return budget


_FIXED = {0xC0: 1, 0xC2: 1, 0xC3: 1, 0xCA: 5, 0xCB: 9, 0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9,
          0xD0: 2, 0xD1: 3, 0xD2: 5, 0xD3: 9}
_SIZED = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}  # bin 8/16/32, str 8/16/32


def _skip_of(body: bytes, at: int) -> int | None:
    """Where the scalar at ``at`` ends (None: not a scalar this codec reads)."""
    b = body[at]
    if b <= 0x7F or b >= 0xE0:
        return at + 1
    if 0xA0 <= b <= 0xBF:
        return at + 1 + (b & 0x1F)
    if b in _FIXED:
        return at + _FIXED[b]
    width = _SIZED.get(b)
    if width is None:
        return None
    return at + 1 + width + int.from_bytes(body[at + 1:at + 1 + width], "big")


# ---------------------------------------------------------------------------------------------
# Plain data (checkpoints, task calls)


def dumps(obj: Any) -> bytes:
    """Serialise plain data (lists, dicts, numbers, strings, bytes), e.g. a checkpoint body."""
    body: bytes = msgpack.packb(obj, use_bin_type=True)
    return body


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
