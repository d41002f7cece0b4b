"""Every wire message round-trips; malformed bodies raise ProtocolError, never anything else."""

from __future__ import annotations

import dataclasses
import typing

import msgpack
import pytest

from blizzard.wire import codec
from blizzard.wire import protocol as p
from blizzard.wire.errors import ProtocolError, UnknownOp, VersionMismatch
from master.state import records


def _sample(tp):
    origin = typing.get_origin(tp)
    if tp is int:
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
    if isinstance(tp, type) and (dataclasses.is_dataclass(tp) or tp in p.WIRE.by_op.values()):
        return _build(tp)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return _sample(args[0])


def _build(cls):
    hints = typing.get_type_hints(cls)
    names = ([f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls)
             else codec.fields_of(cls))
    return cls(*[_sample(hints[n]) for n in names])


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
        p.decode(msgpack.packb([p.VERSION, 1, msgpack.unpackb(records.pack(rec))]))
    with pytest.raises(ProtocolError):
        records.unpack(p.pack(p.Status()))


def _body(*items):
    return msgpack.packb(list(items), use_bin_type=True)


def _frame(op, *fields, rid=1):
    return _body(p.VERSION, rid, [op, *fields])


@pytest.mark.parametrize("body, error", [
    (b"\xc1garbage", ProtocolError),
    (b"", ProtocolError),
    (_body(p.VERSION), ProtocolError),
    (_body(99, 1, [22]), VersionMismatch),
    (_body(p.VERSION, 1, [9999]), UnknownOp),
    (_body(p.VERSION, 1, ["Status"]), UnknownOp),
    (_body(p.VERSION, 1, []), UnknownOp),
    (_body(p.VERSION, -1, [22]), ProtocolError),
    (_body(p.VERSION, 2**64 - 1, [22]), ProtocolError),
    (_body(p.VERSION, 1, [22], "more"), ProtocolError),
    (_frame(20), ProtocolError),  # Stats without its queue
    (_frame(20, 5), ProtocolError),  # queue not a string
    (_frame(14, "q", True, 1.0, 0.0, "r", [], []), ProtocolError),  # n is a bool, not an int
    (_frame(40, [1], ["text"], [0], [], 1), ProtocolError),  # blob is str
    (_frame(12, [1, "2"], []), ProtocolError),
    (_frame(12, [-1], [], "r"), ProtocolError),  # an item id below 0
    (_frame(12, [2**63], [], "r"), ProtocolError),  # an item id past 2**63-1
    (_frame(12, {"ids": [1]}, [], "r"), ProtocolError),  # a map
    (_frame(12, [0] * (codec.MAX_ARRAY + 1), [], "r"), ProtocolError),
    (msgpack.packb({"op": 1}), ProtocolError),
])
def test_malformed_bodies_raise_protocol_errors(body, error):
    with pytest.raises(error):
        p.decode(body)


@pytest.mark.parametrize("bad, named", [(True, "bool"), (1.0, "float"), (None, "None"),
                                        ("7", "str")])
def test_a_wrong_element_deep_in_a_long_list_is_named(bad, named):
    ids = list(range(5000))
    ids[4321] = bad
    with pytest.raises(ProtocolError, match=rf"Commit: Expected `int`, got `{named}` - at "
                                            r"field ids\[4321\]"):
        p.decode(_frame(12, ids, ["dn-a"], "r", []))


def test_an_array_header_claiming_billions_of_elements_costs_nothing():
    body = bytes([0x93, p.VERSION, 1, 0x94, 12]) + b"\xdd\xff\xff\xff\xff" + b"\x00" * 16
    with pytest.raises(ProtocolError, match="length <= "):
        p.decode(body)


def test_a_large_frame_of_tiny_nested_arrays_stops_at_the_element_budget():
    # a Put whose meta list holds many ItemMeta, each with many ids: legal shapes, but more
    # objects than any real frame needs
    meta = [[p.op_of(p.ItemMeta), "q", 0, 0.0, "", 0, "", [0] * 1000]] * 400
    with pytest.raises(ProtocolError, match="array elements in one frame"):
        p.decode(_frame(40, [1], [b"x"], [0], [], 1, "dn", False, None, meta))


def _big_leased(n: int) -> bytes:
    ids = list(range(n))
    nodes = p.ReplicaSet([p.NodeRef("dn-a", "tcp://127.0.0.1:1"), p.NodeRef("dn-b", "tcp://127.0.0.1:2")])
    grant = p.GetGrant(ids, ["dn-a", "dn-b"], 1, 0.0, b"m" * 32)
    return p.encode(1, p.Leased("q", ids, ids, [256] * n, ids, [0] * n, [0] * n, [0.0] * n,
                                [""] * n, [0] * n, [nodes], [], grant, [""] * n))


def test_a_large_reply_is_walked_only_in_its_fields_that_nest(monkeypatch):
    # a Leased of 10,000 items: its columns are bounded by the typed decode; only its replica
    # sets (messages of arrays in an array) are walked in Python, not its 100,000 scalars
    walked: list[int] = []
    count = codec._count_elements
    monkeypatch.setattr(codec, "_count_elements",
                        lambda body, *budget: walked.append(len(body)) or count(body, *budget))
    body = _big_leased(10_000)
    _, msg = p.decode(body)
    assert len(msg.ids) == 10_000 and msg.replica_sets[0].nodes[1].node_id == "dn-b"
    assert walked and sum(walked) < 200 < len(body)


def test_a_nested_bomb_that_does_not_split_into_fields_is_walked_whole():
    # the Put of the element-budget test with a trailing byte: the split into fields fails,
    # so the whole frame is walked (and refused), never decoded unchecked
    meta = [[p.op_of(p.ItemMeta), "q", 0, 0.0, "", 0, "", [0] * 1000]] * 400
    body = _frame(40, [1], [b"x"], [0], [], 1, "dn", False, None, meta) + b"\x00"
    with pytest.raises(ProtocolError, match="array elements in one frame"):
        p.decode(body)


def test_float_lists_take_integers_but_not_booleans():
    enqueue = ["q", [5], [1], [2], [0], [3], [""], False, "r", False, 1, None]
    assert p.decode(_frame(45, *enqueue))[1].delays == [3]
    enqueue[5] = [True]
    with pytest.raises(ProtocolError, match="Expected `float`, got `bool` - at field delays"):
        p.decode(_frame(45, *enqueue))


def test_float_fields_accept_integers():
    _, msg = p.decode(_frame(14, "q", 5, 30, 0, "r1", [], [], False, rid=3))
    assert msg == p.Lease("q", 5, 30.0, 0.0, "r1", [], [])
    assert type(msg.lease_s) is float


def test_a_field_added_later_is_ignored_by_older_peers_and_defaulted_when_missing():
    placement = p.Placement(5, 1, [], 2, 1.0, _build(p.PutGrant), ["dn-x"])
    fields = msgpack.unpackb(p.encode(1, placement))[2]
    assert p.decode(_body(p.VERSION, 1, fields[:-1]))[1].suspects == []  # from an older peer
    assert p.decode(_body(p.VERSION, 1, [*fields, "later", [1]]))[1] == placement  # a newer one


def test_a_version_1_request_is_refused_naming_both_versions_and_the_upgrade_order():
    old = _body(1, 22, 17)  # version 1: [1, op, request id, fields...]: a Status
    with pytest.raises(VersionMismatch) as caught:
        p.decode(old)
    assert caught.value.peer_version == 1
    assert f"wire version 1 met one of wire version {p.VERSION}" in caught.value.message
    assert "upgrade" in caught.value.message and "client" in caught.value.message
    assert p.peek_request_id(old) == 17
    # the refusal is in the layout a version 1 peer reads: its Error (op 1), its request id
    assert msgpack.unpackb(p.refusal(old, caught.value)) == [1, 1, 17, "version",
                                                             caught.value.message]


def test_a_version_1_servers_refusal_reaches_the_waiting_call_as_a_version_error():
    rid, reply = p.decode(_body(1, 1, 9, "version", "protocol version 2 is not 1"))
    assert rid == 9 and isinstance(reply, p.Error) and reply.code == "version"
    assert "version 1" in reply.message and "upgrade" in reply.message
    assert "protocol version 2 is not 1" in reply.message


def test_peek_request_id_of_bad_body():
    assert p.peek_request_id(_body(p.VERSION, 17, [9999])) == 17
    assert p.peek_request_id(_body(p.VERSION, -3, [9999])) is None
    assert p.peek_request_id(b"\xc1") is None
    assert p.peek_request_id(b"") is None
