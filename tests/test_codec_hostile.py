"""Wire version 2 under hostile input: every bad body is a ``ProtocolError`` (never a
``UnicodeDecodeError`` or ``RecursionError`` out of msgspec), answered without a traceback in
the log; a hostile peer's reply cannot stop a data node; and the refusal a version 1 server
sends a version 2 client (request id 0: it cannot read ours) fails the call at once."""

from __future__ import annotations

import logging
import threading
import time
import zlib

import msgpack
import pytest
import zmq

from blizzard.local.harness import free_port
from blizzard.net.transport import Endpoint, call
from blizzard.server.router import RouterServer
from blizzard.wire import protocol as p
from blizzard.wire.errors import ProtocolError, VersionMismatch
from datanode.config import DatanodeConfig
from datanode.server import DatanodeServer
from datanode.store import MemoryStore

# Stats("\xff\xfe"): a str field holding bytes that are not UTF-8
BAD_UTF8 = b"\x93\x02\x07\x92\x14\xa2\xff\xfe"
# Ping plus one extra (ignored) trailing field nested 2,000 deep: 2 KB
DEEP_TRAILING = b"\x93\x02\x07\x92\x2f" + b"\x91" * 2000 + b"\xc0"


@pytest.mark.parametrize("body", [BAD_UTF8, DEEP_TRAILING], ids=["bad-utf8", "deep-trailing"])
def test_hostile_bodies_raise_protocol_errors(body):
    with pytest.raises(ProtocolError):
        p.decode(body)


def test_stored_metadata_with_bad_utf8_raises_protocol_error():
    with pytest.raises(ProtocolError):  # item_meta.decode promises ProtocolError
        p.unpack(b"\x98\x4f\x90\xa1\xff\x00\x00\xa0\x00\xa0")


@pytest.mark.parametrize("body", [BAD_UTF8, DEEP_TRAILING], ids=["bad-utf8", "deep-trailing"])
def test_a_server_answers_a_hostile_body_with_a_protocol_error_and_no_traceback(body, caplog):
    ctx = zmq.Context()
    addr = f"tcp://127.0.0.1:{free_port()}"
    server = RouterServer(ctx, addr)
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(addr)
    try:
        with caplog.at_level(logging.ERROR):
            for _ in range(3):
                dealer.send(body)
            deadline = time.time() + 5
            while time.time() < deadline and len(server.receive(100)) == 0 and \
                    not dealer.poll(0):
                pass
            replies = []
            while dealer.poll(1000) and len(replies) < 3:
                replies.append(p.decode(dealer.recv())[1])
                server.receive(10)
        assert [r.code for r in replies] == ["protocol"] * 3
        assert not [r for r in caplog.records if r.exc_info]
    finally:
        dealer.close(linger=0)
        server.close()
        ctx.term()


def test_a_hostile_forward_target_cannot_kill_a_data_node(tmp_path):
    """Insecure node: any client may name forward targets; the target's reply is decoded in
    ``Endpoint.read_ready``, which ``run_once`` calls outside ``_guarded``."""
    ctx = zmq.Context()
    evil_addr = f"tcp://127.0.0.1:{free_port()}"
    evil = ctx.socket(zmq.ROUTER)
    evil.bind(evil_addr)
    config = DatanodeConfig(data_dir=str(tmp_path), bind=f"tcp://127.0.0.1:{free_port()}")
    node = DatanodeServer(config, store=MemoryStore())
    client = ctx.socket(zmq.DEALER)
    client.connect(node.config.bind)
    try:
        blob = b"x"
        put = p.Put([1], [blob], [zlib.crc32(blob)], [p.NodeRef("evil", evil_addr)], 1, "",
                    False, None)
        client.send(p.encode(9, put))
        for _ in range(50):
            node.run_once(timeout_ms=20)
            if evil.poll(0):
                break
        peer, body = evil.recv_multipart()
        rid, _ = p.decode(body)
        evil.send_multipart([peer, b"\x93\x02" + msgpack.packb(rid) + b"\x92\x29\x91\xa1\xff"])
        for _ in range(20):
            node.run_once(timeout_ms=20)  # the bad reply is logged, never raised
    finally:
        client.close(linger=0)
        evil.close(linger=0)
        node.close()
        ctx.term()


def test_a_version_1_servers_refusal_fails_the_call_at_once():
    """A version 1 server answers a version 2 request with request id 0: its peek_request_id
    reads the third element, which is now the message array. (A ROUTER here sends exactly what
    the release of 2026-11 sends; a review ran the real one too.)"""
    ctx = zmq.Context()
    addr = f"tcp://127.0.0.1:{free_port()}"
    old = ctx.socket(zmq.ROUTER)
    old.bind(addr)

    def answer() -> None:
        if old.poll(5000):
            peer, _ = old.recv_multipart()
            old.send_multipart([peer, msgpack.packb([1, 1, 0, "version",
                                                     "protocol version 2 is not 1"])])

    thread = threading.Thread(target=answer)
    thread.start()
    ep = Endpoint(ctx, addr)
    try:
        started = time.time()
        with pytest.raises(VersionMismatch, match="wire version 1 met one of wire version 2"):
            call(ep, p.Status(), 3.0)
        assert time.time() - started < 1
    finally:
        thread.join()
        ep.close()
        old.close(linger=0)
        ctx.term()
