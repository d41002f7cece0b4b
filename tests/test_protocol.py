"""Every wire message round-trips; malformed bodies raise ProtocolError, never anything else."""

from __future__ import annotations

import dataclasses
import typing

import msgpack
import pytest

from blizzard.wire import protocol as p
from blizzard.wire.errors import ProtocolError, UnknownOp, VersionMismatch
from master import records


def _sample(tp):
    origin = typing.get_origin(tp)
    if tp is int or tp is p.Id:
        return 7
    if tp is float:
        return 1.5
    if tp is str:
        return "q"
    if tp is bytes:
        return b"\x00\xff"
    if tp is bool:
        return True
    if origin is list:
        return [_sample(typing.get_args(tp)[0]), _sample(typing.get_args(tp)[0])]
    if dataclasses.is_dataclass(tp):
        return _build(tp)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return _sample(args[0])


def _build(cls):
    hints = typing.get_type_hints(cls)
    return cls(*[_sample(hints[f.name]) for f in dataclasses.fields(cls)])


ALL = sorted(p.WIRE.by_op.values(), key=p.op_of)


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_every_message_round_trips(cls):
    msg = _build(cls)
    assert p.decode(p.encode(42, msg)) == (42, msg)
    assert p.unpack(p.pack(msg)) == msg


@pytest.mark.parametrize("cls", sorted(records.RECORDS.by_op.values(), key=p.op_of),
                         ids=lambda c: c.__name__)
def test_every_wal_record_round_trips_and_is_no_wire_message(cls):
    rec = _build(cls)
    assert records.unpack(records.pack(rec)) == rec
    with pytest.raises(UnknownOp):
        p.decode(msgpack.packb([p.VERSION, p.op_of(cls), 1, *msgpack.unpackb(records.pack(rec))[1:]]))
    with pytest.raises(ProtocolError):
        records.unpack(p.pack(p.Status()))


def _body(*items):
    return msgpack.packb(list(items), use_bin_type=True)


@pytest.mark.parametrize("body, error", [
    (b"\xc1garbage", ProtocolError),
    (_body(p.VERSION), ProtocolError),
    (_body(99, 22, 1), VersionMismatch),
    (_body(p.VERSION, 9999, 1), UnknownOp),
    (_body(p.VERSION, "Status", 1), UnknownOp),
    (_body(p.VERSION, 22, -1), ProtocolError),
    (_body(p.VERSION, 20, 1), ProtocolError),  # Stats without its queue
    (_body(p.VERSION, 20, 1, 5), ProtocolError),  # queue not a string
    (_body(p.VERSION, 14, 1, "q", True, 1.0, 0.0, "r", [], []), ProtocolError),  # n is a bool, not an int
    (_body(p.VERSION, 40, 1, [1], ["text"], [0], [], 1), ProtocolError),  # blob is str
    (_body(p.VERSION, 12, 1, [1, "2"], []), ProtocolError),
    (msgpack.packb({"op": 1}), ProtocolError),
])
def test_malformed_bodies_raise_protocol_errors(body, error):
    with pytest.raises(error):
        p.decode(body)


@pytest.mark.parametrize("bad, named", [(True, "bool"), (1.0, "float"), (None, "NoneType"),
                                        ("7", "str")])
def test_a_wrong_element_deep_in_a_long_list_is_named(bad, named):
    ids = list(range(5000))
    ids[4321] = bad
    with pytest.raises(ProtocolError, match=f"expected int elements, got {named}"):
        p.decode(_body(p.VERSION, 12, 1, ids, ["dn-a"], "r", []))  # a Commit


def test_float_lists_take_integers_but_not_booleans():
    enqueue = [p.VERSION, 45, 1, "q", [5], [1], [2], [0], [3], [""], False, "r", False, 1, None]
    assert p.decode(_body(*enqueue))[1].delays == [3]
    enqueue[8] = [True]
    with pytest.raises(ProtocolError, match="number elements, got bool"):
        p.decode(_body(*enqueue))


def test_float_fields_accept_integers():
    _, msg = p.decode(_body(p.VERSION, 14, 3, "q", 5, 30, 0, "r1", [], [], False))
    assert msg == p.Lease("q", 5, 30.0, 0.0, "r1", [], [])


def test_peek_request_id_of_bad_body():
    assert p.peek_request_id(_body(p.VERSION, 9999, 17)) == 17
    assert p.peek_request_id(b"\xc1") is None
