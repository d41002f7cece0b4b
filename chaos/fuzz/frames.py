"""Hostile frames for the servers: random, mutated, type-confused, extreme and odd-shaped.

``frames(rng)`` yields (category, frames) pairs, each a ZeroMQ message a DEALER could send:
usually one body, sometimes several frames or none. ``fuzz(addr, n)`` sends ``n`` of them to
a server, pacing with a ``Status``/``Get`` round trip every ``check_every`` frames, and
reports how many the server answered. The hostile socket may be one the server refuses (no
key, an unknown key): then the pacing goes over a second, admitted socket (``probe``).
Whether the server survived, and whether the items did, is the caller's to check
(``chaos/fuzz/campaign.py``).

Templates use ids far above any a test allocates and node ids of their own, so a frame that
happens to be a valid request cannot settle, delete or move a real item; a mutated frame that
would (``chaos/fuzz/guard.py``) is replaced by another. What the fuzzer probes is parsing and
validation, not what a key may do.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq

from blizzard.wire import protocol as p
from chaos.fuzz.guard import Protected

FAR = 2**40  # template ids start here, above anything a test cluster hands out
EXTREME_INTS = [-1, -2**31 - 1, -2**63, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 0]
EXTREME_FLOATS = [math.nan, math.inf, -math.inf, 1e308, -1e308, -0.0, 5e-324]
CATEGORIES = ("random", "mutated", "confusion", "extreme", "structure")


def templates(rng: random.Random) -> list[Any]:
    """One well-formed message of every kind, with harmless values."""
    ids = [FAR + rng.randrange(10**6) for _ in range(3)]
    ref = p.NodeRef("fz-node", "tcp://127.0.0.1:9")
    put_grant = p.PutGrant(ids[0], 3, ["fz-node"], 1, 2e9, b"m" * 16)  # forged
    get_grant = p.GetGrant(ids, ["fz-node"], 1, 2e9, b"m" * 16)
    return [
        p.Place(2, []),
        p.Enqueue("fz-q", ids[:2], [3, 4], [1, 2], [0, 1], [0.0, 1.0], ["", "k"], False, "fz-enq",
                  False, 0.2, put_grant),
        p.PutReport("fz-node", ids[:2], ids[2:], "boom"),
        p.Commit(ids, ["fz-node"], "fz-req"),
        p.Lease("fz-q", 2, 1.0, 0.0, "fz-lease", ids[:1], [5]),
        p.Ack(ids, [1, 2, 3], False), p.Ack(ids, [1, 2, 3], True),
        p.Nack(ids[:1], [1], 0.5, "boom"), p.Extend(ids[:1], [1], 2.0),
        p.Stats("fz-q"), p.Ping(), p.ListQueues(), p.Status(), p.Peek("fz-q", 3),
        p.Redrive("fz-q", 1),
        p.Configure("fz-q", False, 2.0, 3, "", 0.0, 1.0, 0.0, 0), p.Purge("fz-q"),
        p.RemoveNode("fz-node"), p.DeleteItem("fz-q", ids[0], True), p.DeleteQueue("fz-q", True),
        p.Heartbeat("fz-node", "tcp://127.0.0.1:9", 1, 2, 3),
        p.Replicated("fz-node", "fz-other", ids, ids[:1]), p.Inventory("fz-node", ids, True),
        p.BadReplica(ids[:2], ["fz-node", "fz-other"]),
        p.Put(ids[:2], [b"ab", b"cd"], [0x9E83486D, 0x3F8B7BCA], [ref], 1, "", False, None),
        p.Put(ids[:2], [b"ab", b"cd"], [0x9E83486D, 0x3F8B7BCA], [], 1, "", True, put_grant),
        p.Put(ids[:2], [b"ab", b"cd"], [0x9E83486D, 0x3F8B7BCA], [], 1, "", True, put_grant,
              [p.ItemMeta([], "fz-q", 1, 0.0, "k", 0, "")]),
        p.ListMeta(0, 10), p.ListMeta(ids[0], 5000),
        p.Get(ids, None), p.Get(ids, get_grant), p.Delete(ids, None), p.Delete(ids, put_grant),
        p.Ok(), p.Error("x", "y"), p.Stored(["fz-node"]),
        p.Placement(ids[0], 3, [ref], 1, 1.0, put_grant), p.Unstored(["fz-node"], "x"),
        p.Committed(3), p.Acked(1, []), p.Removed(1),
        p.HeartbeatReply(ids, [p.CopyOrder(ref, ids)], True, [p.CapabilityKey(1, b"k" * 32)], "",
                         0, [p.ItemMeta(ids, "fz-q", 0, 0.0, "", 2, "fz-o")]),
        p.Follow("fz-sb", "tcp://127.0.0.1:9", "", -1, 0, 0), p.Promote(False),
    ]


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 4 else 7)
    if kind == 0:
        return rng.choice(EXTREME_INTS + [rng.randrange(-1000, 1000)])
    if kind == 1:
        return rng.choice(EXTREME_FLOATS + [rng.random()])
    if kind == 2:
        return "".join(chr(rng.randrange(0x10FFFF)) for _ in range(rng.randrange(8))
                       ).encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    if kind == 3:
        return rng.randbytes(rng.randrange(16))
    if kind == 4:
        return rng.choice([None, True, False])
    if kind == 5:
        return "x" * rng.choice([0, 1, 300, 70_000])
    if kind == 6:
        return []
    if kind == 7:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {"k": _random_value(rng, depth + 1)}


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _pack_with_nested(fields: list, k: int, depth: int) -> bytes:
    """``fields`` packed as an array whose field ``k`` is ``[[[...1...]]]``, ``depth`` deep.

    Built byte by byte: msgpack's own packer refuses to nest this deep.
    """
    parts = [_pack(v) for v in fields]
    parts[k] = b"\x91" * depth + b"\x01"
    n = len(fields)
    header = bytes([0x90 | n]) if n < 16 else b"\xdc" + n.to_bytes(2, "big")
    return header + b"".join(parts)


def _body_fields(msg: Any) -> list:
    """A frame's parts flat, ``[version, op, request_id, field_1, ...]``, to mutate one by one
    (``_pack_flat`` puts them back in the frame's layout)."""
    version, rid, (op, *fields) = msgpack.unpackb(p.encode(1, msg), raw=False,
                                                  strict_map_key=False)
    return [version, op, rid, *fields]


def _pack_flat(flat: list) -> bytes:
    """``flat`` (as ``_body_fields`` gives it) in the frame layout ``[version, rid, [op, ...]]``;
    fewer than three parts are packed as they are."""
    if len(flat) < 3:
        return _pack(flat)
    return _pack([flat[0], flat[2], [flat[1], *flat[3:]]])


def one_frame(rng: random.Random, category: str, base: list[Any]) -> list[bytes]:
    """One hostile message of ``category``."""
    msg = rng.choice(base)
    fields = _body_fields(msg)
    if category == "random":
        if rng.random() < 0.5:
            return [rng.randbytes(rng.randrange(0, 2000))]
        return [_pack([_random_value(rng) for _ in range(rng.randrange(6))])]
    if category == "mutated":
        body = bytearray(p.encode(rng.randrange(1, 2**31), msg))
        for _ in range(rng.randrange(1, 9)):
            action = rng.randrange(4)
            if action == 0 and body:
                body[rng.randrange(len(body))] = rng.randrange(256)
            elif action == 1 and body:
                del body[rng.randrange(len(body)):]
            elif action == 2:
                at = rng.randrange(len(body) + 1)
                body[at:at] = rng.randbytes(rng.randrange(1, 16))
            elif body:
                at = rng.randrange(len(body))
                body[at:at] = body[at:at + rng.randrange(1, 64)]
        return [bytes(body)]
    if category == "confusion":
        k = rng.randrange(len(fields))
        fields[k] = _random_value(rng)
        return [_pack_flat(fields)]
    if category == "extreme":
        k = rng.randrange(2, len(fields)) if len(fields) > 2 else 2
        if k >= len(fields):
            fields.append(rng.choice(EXTREME_INTS))
        elif isinstance(fields[k], list):
            value = rng.choice(EXTREME_INTS + EXTREME_FLOATS)
            fields[k] = [value] * rng.choice([1, 9, 10_001])
        elif isinstance(fields[k], float):
            fields[k] = rng.choice(EXTREME_FLOATS)
        elif isinstance(fields[k], str):
            fields[k] = rng.choice(["", " ", "\x00", "tcp://x", "x" * 100_000, "tcp://[::1",
                                    "é" * 300])
        else:
            fields[k] = rng.choice(EXTREME_INTS)
        return [_pack_flat(fields)]
    # structure: nesting, wide arrays, maps, frame counts, wrong version
    shape = rng.randrange(8)
    if shape == 0:
        depth = rng.choice([10, 500, 1010, 1030, 5000])
        if rng.random() < 0.1:
            return [b"\x91" * depth + b"\x01"]
        message = [fields[1], *fields[3:]]
        nested = _pack_with_nested(message, rng.randrange(len(message)), depth)
        return [b"\x93" + _pack(fields[0]) + _pack(fields[2]) + nested]
    if shape == 1:
        return [_pack([p.VERSION, 1, [fields[1], [[]] * rng.choice([1000, 40_000, 60_000])]])]
    if shape == 2:
        return [_pack({"version": 1, "op": fields[1]})]
    if shape == 3:
        return [_pack_flat(fields)] * rng.randrange(2, 4)
    if shape == 4:
        return [b""]
    if shape == 5:
        fields[0] = rng.choice([0, 1, 3, -1, "1", None, 1.0])
        return [_pack_flat(fields)]
    if shape == 6:
        fields[2] = rng.choice([-1, -2**63, 2**64 - 1, "id", None, 1.5])
        return [_pack_flat(fields)]
    return [_pack_flat(fields + [_random_value(rng) for _ in range(rng.randrange(1, 4))])]


def frames(rng: random.Random, protect: Protected | None = None
           ) -> Iterator[tuple[str, list[bytes]]]:
    """Hostile messages for ever; one that ``protect`` says names a real item or name comes
    as ("spared", []) instead."""
    base = templates(rng)
    while True:
        category = rng.choice(CATEGORIES)
        msg = one_frame(rng, category, base)
        if protect is not None and protect.touches(msg):
            yield "spared", []
        else:
            yield category, msg


@dataclass
class FuzzResult:
    sent: int = 0
    answered: int = 0
    spared: int = 0  # frames not sent: they named a protected id or name
    unsent: int = 0  # frames the socket would not take (a refused socket's queue was full)
    probe_max_ms: float = 0.0  # the slowest pacing round trip
    by_category: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)  # error codes of the replies
    alive_checks: int = 0
    seconds: float = 0.0


STATUS = p.Status()  # the round trip that paces a run, unless another is given


def fuzz(addr: str, n: int, *, seed: int = 0, check_every: int = 250,
         check: Any = STATUS, timeout_s: float = 5.0,
         connect: Callable[[str], zmq.Socket] | None = None,
         probe: Callable[[str], zmq.Socket] | None = None,
         protect: Protected | None = None) -> FuzzResult:
    """Send ``n`` hostile messages to ``addr``; a round trip every ``check_every`` must succeed.

    ``connect`` makes the connected DEALER the frames go over (with a key, for a secure
    server); default a plain one. ``probe`` makes the socket the pacing round trips go over;
    default the same one. Raises ``AssertionError`` if the server stops answering its pacing
    check.
    """
    rng = random.Random(seed)
    if connect is None:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(addr)
    else:
        sock = connect(addr)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    checker = sock if probe is None else probe(addr)
    result = FuzzResult()
    started = time.monotonic()
    gen = frames(rng, protect)
    try:
        while result.sent < n:
            batch_end = min(result.sent + check_every, n)
            while result.sent < batch_end:
                category, msg = next(gen)
                if category == "spared":
                    result.spared += 1
                    continue
                if msg:
                    try:
                        sock.send_multipart(msg, zmq.NOBLOCK)
                    except zmq.Again:
                        result.unsent += 1
                result.sent += 1
                result.by_category[category] = result.by_category.get(category, 0) + 1
            _drain(sock, result, 0)
            rid = 2**62 + result.sent
            asked = time.monotonic()
            checker.send(p.encode(rid, check))
            deadline = asked + timeout_s
            while not _drain(checker, result, 50, want=rid):
                if time.monotonic() > deadline:
                    raise AssertionError(f"{addr} stopped answering after {result.sent} frames")
            result.probe_max_ms = max(result.probe_max_ms, (time.monotonic() - asked) * 1000)
            result.alive_checks += 1
            _drain(sock, result, 0)
    finally:
        sock.close(linger=0)
        if checker is not sock:
            checker.close(linger=0)
    result.seconds = time.monotonic() - started
    return result


def _drain(sock: zmq.Socket, result: FuzzResult, wait_ms: int, want: int | None = None) -> bool:
    """Read waiting replies; True once the reply with request id ``want`` came."""
    got = False
    while sock.poll(wait_ms, zmq.POLLIN):
        wait_ms = 0
        body = sock.recv()
        rid, reply = p.decode(body)  # every reply must decode: it may not echo a bad request id
        if rid == want:  # the pacing check's: an answer or an error, both say "alive"
            got = True
            continue
        result.answered += 1
        if isinstance(reply, p.Error):
            result.errors[reply.code] = result.errors.get(reply.code, 0) + 1
    return got
