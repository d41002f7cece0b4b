"""The codec behind ``blizzard.wire.protocol``: the message registry, type-checked decode, msgpack.

Frame layout (ZeroMQ): a client's DEALER socket sends one frame, the body; a server's ROUTER
socket sees ``[peer identity, body]`` and replies on the same identity with one body.

Body: a msgpack array ``[VERSION, op, request_id, field_1, ..., field_n]``. ``op`` is the
message's small integer code, ``request_id`` a non-negative integer the reply repeats so a
client may keep many requests in flight. Fields follow the dataclass's field order; a nested
message (e.g. ``NodeRef``) travels as a plain array of its fields. Every field is checked
against its declared type on decode, so a handler only ever sees well-typed messages. Fields
added in a later release (``ADDED``) may be missing at the end, and are left off while they
hold their defaults.

This module and ``protocol`` (which defines every message with ``@message``) are the only
places that know the bytes; nothing else calls msgpack.
"""

from __future__ import annotations

import dataclasses
import operator
import threading
import types
import typing
from typing import Any, Callable, Iterator, TypeVar

import msgpack

from blizzard.wire.errors import ProtocolError, UnknownOp, VersionMismatch

VERSION = 1
# A field added to a message after its first release, last in the message and with a default:
# ``field(default=..., metadata=ADDED)``. It is left off the wire while it holds its default, and
# a frame without it decodes to the default, so peers of the release before still understand
# each other in the usual case (docs/operations.md, upgrades).
ADDED = {"added": True}
MAX_BATCH = 10_000  # items in one request
# The largest legal frame: a put of a 16 MiB chunk plus one item of up to 16 MiB, with its
# ids and checksums; also the largest reply (a data node caps a read's reply below it).
# ZMQ_MAXMSGSIZE on data nodes and clients; kept below the WAL's record limit (64 MiB).
MAX_FRAME_BYTES = 40 * 1024 * 1024
MAX_ITEM_BYTES = 16 * 1024 * 1024  # the largest item any configuration may allow
MAX_ID = 2**63 - 1  # item ids are non-negative and fit a signed 64-bit integer
MAX_ARRAY = MAX_BATCH * 4 + 16  # elements in any one array
# Python objects one frame may unpack into: a legal frame needs a few columns of MAX_BATCH
# elements; a hostile one of tiny nested arrays would otherwise cost ~70 bytes per byte.
MAX_ELEMENTS = MAX_BATCH * 16

M = TypeVar("M")  # a message class

Id = typing.NewType("Id", int)  # an item id on the wire: 0 <= id <= MAX_ID

_OP_OF: dict[type, int] = {}  # every registered class, of any registry -> its op code
_CHECKERS: dict[type, Callable[[Any], Any]] = {}
_FIELDS: dict[type, Callable[[Any], list[Any]]] = {}  # message class -> its fields as a plain list
_NUMBER = {int, float}


class Registry:
    """A family of message classes by op code: the wire protocol's, or the WAL's records.

    Each family decodes only its own: a network frame can never be taken for a WAL record.
    Op codes are unique across families, so a record's bytes name what it is.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self.by_op: dict[int, type] = {}

    def message(self, op: int) -> Callable[[type[M]], type[M]]:
        """Class decorator: make a frozen dataclass a member with code ``op``."""

        def wrap(cls: type[M]) -> type[M]:
            cls = dataclasses.dataclass(frozen=True, slots=True)(cls)
            if op in _OP_OF.values():
                raise RuntimeError(f"op {op} used twice ({cls.__name__})")
            self.by_op[op] = cls
            _OP_OF[cls] = op
            return cls

        return wrap

    def unpack(self, body: bytes) -> Any:
        """Inverse of ``pack`` for this family; raises ``ProtocolError`` on anything malformed."""
        try:
            raw = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
        except Exception as exc:
            raise ProtocolError(f"{self.what} is not valid msgpack: {exc}") from None
        if type(raw) is not list or not raw or type(raw[0]) is not int or raw[0] not in self.by_op:
            raise ProtocolError(f"{self.what} has no known type")
        return _from_fields(self.by_op[raw[0]], raw[1:])


WIRE = Registry("message")  # every wire message, of every family (``protocol`` is their namespace)
_BY_OP = WIRE.by_op


@typing.dataclass_transform(frozen_default=True)  # type checkers see each message's fields
def message(op: int) -> Callable[[type[M]], type[M]]:
    """Class decorator: make a frozen dataclass a wire message with code ``op``."""
    return WIRE.message(op)


def as_ids(values: list[int]) -> list[Id]:
    """``values`` (the same list) typed as item ids for a message; the receiver checks each."""
    return typing.cast("list[Id]", values)


def op_of(cls: type) -> int:
    """The op code a message or WAL record class was registered with."""
    return _OP_OF[cls]


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


def _checker(tp: Any) -> Callable[[Any], Any]:
    """Build a function that validates (and normalises) a decoded value of type ``tp``."""
    origin = typing.get_origin(tp)
    if tp is Id:
        def check_id(v: Any) -> int:
            if type(v) is not int or not 0 <= v <= MAX_ID:
                raise ProtocolError(f"expected an item id (0..2**63-1), got {brief(v)}")
            return v
        return check_id
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
    if tp is str or tp is bytes:  # lengths: bounded by the frame; handlers set tighter limits
        def check_plain(v: Any) -> Any:
            if type(v) is not tp:
                raise ProtocolError(f"expected {tp.__name__}, got {type(v).__name__}")
            return v
        return check_plain
    if origin is list:
        (inner,) = typing.get_args(tp)
        check_inner = _checker(inner)
        if inner is float:
            def check_float_list(v: Any) -> list[Any]:
                if type(v) is not list:
                    raise ProtocolError(f"expected an array, got {type(v).__name__}")
                kinds = set(map(type, v))  # one pass in C; the loop below only names the culprit
                if not kinds <= _NUMBER:
                    bad = next(x for x in v if type(x) not in _NUMBER)
                    raise ProtocolError(f"expected number elements, got {type(bad).__name__}")
                return v
            return check_float_list
        if inner in (int, str, bytes, Id):
            base = int if inner is Id else inner
            allowed = {base}

            def check_plain_list(v: Any) -> list[Any]:
                if type(v) is not list:
                    raise ProtocolError(f"expected an array, got {type(v).__name__}")
                if len(v) > MAX_BATCH * 4:
                    raise ProtocolError(f"array of {len(v)} elements is too long")
                kinds = set(map(type, v))  # one pass in C; the loops below only name a culprit
                if not kinds <= allowed:
                    bad = next(x for x in v if type(x) is not base)
                    raise ProtocolError(f"expected {base.__name__} elements, got {type(bad).__name__}")
                if not v:
                    return v
                if inner is Id and (min(v) < 0 or max(v) > MAX_ID):
                    bad = next(x for x in v if not 0 <= x <= MAX_ID)
                    raise ProtocolError(f"expected item ids (0..2**63-1), got {brief(bad)}")
                return v
            return check_plain_list

        def check_list(v: Any) -> list[Any]:
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
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return lambda v: _from_fields(tp, v)
    raise TypeError(f"unsupported wire type {tp!r}")


def _field_checkers(cls: type) -> Callable[[Any], Any]:
    checker = _CHECKERS.get(cls)
    if checker is None:
        hints = typing.get_type_hints(cls)
        names = [f.name for f in dataclasses.fields(cls)]
        checks = [_checker(hints[n]) for n in names]
        count = len(names)
        least = count - len(_added(cls))

        def checker(values: Any) -> Any:
            if type(values) is not list or not least <= len(values) <= count:
                raise ProtocolError(f"{cls.__name__} takes {count} fields" if least == count
                                    else f"{cls.__name__} takes {least} to {count} fields")
            return cls(*[c(v) for c, v in zip(checks, values)])

        _CHECKERS[cls] = checker
    return checker


def _from_fields(cls: type, values: Any) -> Any:
    try:
        return _field_checkers(cls)(values)
    except ProtocolError as exc:
        raise ProtocolError(f"{cls.__name__}: {exc.message}") from None


def _added(cls: type) -> list[tuple[int, Any]]:
    """(position, default) of the fields at the end of ``cls`` marked ``ADDED``."""
    fields = dataclasses.fields(cls)
    tail: list[tuple[int, Any]] = []
    for k in range(len(fields) - 1, -1, -1):
        f = fields[k]
        if not f.metadata.get("added"):
            break
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING \
            else f.default
        tail.append((k, default))
    return tail


def _to_fields(msg: Any) -> list[Any]:
    cls = type(msg)
    flatten = _FIELDS.get(cls)
    if flatten is None:
        flatten = _FIELDS[cls] = _trimmed(_flattener(cls), _added(cls))
    return flatten(msg)


def _trimmed(flatten: Callable[[Any], list[Any]],
             tail: list[tuple[int, Any]]) -> Callable[[Any], list[Any]]:
    """``flatten``, leaving off the added fields at the end that hold their defaults."""
    if not tail:
        return flatten

    def trim(msg: Any) -> list[Any]:
        out = flatten(msg)
        for k, default in tail:  # from the last field back
            if len(out) != k + 1 or out[k] != default:
                break
            out.pop()
        return out
    return trim


def _flattener(cls: type) -> Callable[[Any], list[Any]]:
    """A function listing a message's fields, nested messages as plain arrays (built once)."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    nested = {}
    for i, name in enumerate(names):
        tp = hints[name]
        if typing.get_origin(tp) in (typing.Union, types.UnionType):  # X | None
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        inner = typing.get_args(tp)[0] if typing.get_origin(tp) is list else tp
        if dataclasses.is_dataclass(inner):
            nested[i] = inner is not tp  # True: a list of messages
    if not nested:
        if not names:
            return lambda msg: []
        if len(names) == 1:
            name = names[0]
            return lambda msg: [getattr(msg, name)]
        get_all = operator.attrgetter(*names)
        return lambda msg: list(get_all(msg))

    def flatten(msg: Any) -> list[Any]:
        out = [getattr(msg, name) for name in names]
        for i, many in nested.items():
            v = out[i]
            if many:
                out[i] = [_to_fields(x) for x in v]
            elif v is not None:
                out[i] = _to_fields(v)
        return out
    return flatten


_PACKERS = threading.local()  # one msgpack Packer per thread: half the cost of packb's new one


def encode(request_id: int, msg: Any) -> bytes:
    """Serialise a message (reply or request) with its request id into one frame body."""
    op = _OP_OF[type(msg)]
    packer = getattr(_PACKERS, "packer", None)
    if packer is None:
        packer = _PACKERS.packer = msgpack.Packer(use_bin_type=True)
    body: bytes = packer.pack([VERSION, op, request_id, *_to_fields(msg)])
    return body


def peek_request_id(body: bytes) -> int | None:
    """Best-effort request id of a body that failed to decode, so the error can be routed.

    Only a request id a client could have sent (non-negative, 64-bit) is returned: echoing
    anything else would make a reply the client cannot decode.
    """
    try:
        unpacker = msgpack.Unpacker(max_buffer_size=len(body) + 1, max_array_len=MAX_ARRAY,
                                    max_map_len=0)
        unpacker.feed(body)
        if unpacker.read_array_header() < 3:
            return None
        unpacker.skip()
        unpacker.skip()
        rid = unpacker.unpack()
    except Exception:
        return None
    return rid if type(rid) is int and 0 <= rid <= MAX_ID else None


def _unpack_bounded(body: bytes) -> Any:
    """msgpack-decode one frame, refusing shapes no message has before they cost memory.

    Lengths are bounded per array and string. Every element takes at least a byte, so a frame
    of ``MAX_ELEMENTS`` bytes or less cannot hold more; a larger one has its array elements
    counted as each array completes (``list_hook``), so a frame of millions of tiny arrays
    stops after ``MAX_ELEMENTS`` instead of growing 70-fold.
    """
    limits = dict(raw=False, strict_map_key=True, use_list=True, max_array_len=MAX_ARRAY,
                  max_map_len=0, max_str_len=MAX_FRAME_BYTES, max_bin_len=MAX_FRAME_BYTES,
                  max_ext_len=0)
    if len(body) <= MAX_ELEMENTS:  # the usual frame: no Python call per array
        return msgpack.unpackb(body, **limits)
    budget = [MAX_ELEMENTS]

    def count(items: list[Any]) -> list[Any]:
        budget[0] -= len(items) + 1
        if budget[0] < 0:
            raise ProtocolError(f"more than {MAX_ELEMENTS} array elements in one frame")
        return items

    return msgpack.unpackb(body, list_hook=count, **limits)


def decode(body: bytes) -> tuple[int, Any]:
    """Parse and type-check one frame body; raise ``ProtocolError`` (or a subclass) if it is bad."""
    try:
        raw = _unpack_bounded(body)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack's own errors, and its limits (ValueError, StackError)
        raise ProtocolError(f"body is not valid msgpack: {type(exc).__name__}: "
                            f"{str(exc)[:200]}") from None
    if type(raw) is not list or len(raw) < 3:
        raise ProtocolError("body must be an array [version, op, request_id, ...]")
    version, op, rid = raw[0], raw[1], raw[2]
    if type(version) is not int or version != VERSION:
        raise VersionMismatch(f"protocol version {brief(version)} is not {VERSION}")
    if type(rid) is not int or not 0 <= rid <= MAX_ID:
        raise ProtocolError("request id must be a non-negative 64-bit integer")
    cls = _BY_OP.get(op) if type(op) is int else None
    if cls is None:
        raise UnknownOp(f"unknown op {brief(op)}")
    return rid, _from_fields(cls, raw[3:])


def pack(msg: Any) -> bytes:
    """Serialise a registered message without a request id (a WAL record, say)."""
    body: bytes = msgpack.packb([_OP_OF[type(msg)], *_to_fields(msg)], use_bin_type=True)
    return body


unpack = WIRE.unpack


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


def op_name(msg: Any) -> str:
    return type(msg).__name__
