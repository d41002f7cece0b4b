"""The receive loops read what is waiting with as few ZeroMQ calls as they can (issue 35):
each ``EVENTS`` check is a system call inside libzmq. A client stops reading once the reply
it waits for is in; a server's pass reads until ``zmq.Again`` instead of checking before
every message. Nothing is lost either way: what is left is read on the next call."""

from __future__ import annotations

from typing import Any

import zmq

from blizzard.net import transport
from blizzard.net.transport import Endpoint
from blizzard.server.router import RouterServer
from blizzard.wire import protocol as p


class FakeDealer:
    """Frames waiting on a DEALER socket, and how often ``EVENTS`` was asked."""

    def __init__(self, frames: list[bytes]) -> None:
        self.frames = frames
        self.events_asked = 0

    def recv(self, flags: int = 0, copy: bool = True) -> bytes:
        if not self.frames:
            raise zmq.Again()
        return self.frames.pop(0)

    def get(self, option: int) -> int:
        assert option == int(zmq.EVENTS)
        self.events_asked += 1
        return int(zmq.POLLIN) if self.frames else 0


def endpoint_with(frames: list[bytes]) -> tuple[Endpoint, FakeDealer]:
    ep = Endpoint(zmq.Context.instance(), "tcp://127.0.0.1:9")
    fake = FakeDealer(frames)
    ep.sock = fake  # type: ignore[assignment]  # open_socket returns it as it is
    return ep, fake


def test_a_client_stops_reading_once_the_reply_it_waits_for_is_in():
    ep, fake = endpoint_with([p.encode(7, p.Ping()), p.encode(8, p.Ping())])
    ep.read_ready(want=7)
    assert ep.has(7) and not ep.has(8)
    assert fake.events_asked == 0  # no system call after the awaited reply
    assert len(fake.frames) == 1
    ep.read_ready()  # the next read takes the rest
    assert ep.has(8) and not fake.frames


def test_a_client_reads_everything_waiting_when_it_waits_for_no_one_reply():
    ep, fake = endpoint_with([p.encode(rid, p.Ping()) for rid in (1, 2, 3)])
    ep.read_ready()
    assert [ep.has(rid) for rid in (1, 2, 3)] == [True, True, True]
    assert fake.events_asked == 3  # one check after each reply: the last finds none


def test_a_client_read_with_nothing_waiting_returns_quietly():
    ep, fake = endpoint_with([])
    ep.read_ready(want=5)
    assert not ep.has(5) and fake.events_asked == 0


def test_a_server_pass_takes_at_most_its_batch_and_ends_at_again():
    ctx = zmq.Context()
    addr = f"inproc://receive-loops-{id(ctx)}"
    server = RouterServer(ctx, addr, max_batch=10)
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(addr)
    try:
        for rid in range(1, 26):  # inproc: queued at the server once send returns
            dealer.send(p.encode(rid, p.Ping()))
        dealer.send_multipart([p.encode(99, p.Ping()), b"extra"])  # refused, not returned
        passes = [server.receive(0) for _ in range(4)]
        assert [len(batch) for batch in passes] == [10, 10, 5, 0]
        assert [rid for batch in passes for _, rid, _ in batch] == list(range(1, 26))
        assert all(isinstance(msg, p.Ping) for batch in passes for _, _, msg in batch)
        assert dealer.poll(1000)  # the two-frame message was answered with an error
        reply: Any = p.decode(dealer.recv())[1]
        assert isinstance(reply, p.Error) and reply.code == "protocol"
        assert transport.FRAMES["received"] >= 25
    finally:
        dealer.close(linger=0)
        server.close()
        ctx.term()


def test_an_answer_on_a_data_node_connection_is_taken_only_if_the_master_signed_it():
    """A lease's answer may come on a data-node connection (a push, master/consume/pushes.py): one
    the check refuses (a node making up an answer for a request id it guessed) is dropped
    and the call waits on; a genuine one wins, and the master's connection drops its own."""
    master, _ = endpoint_with([])
    node, _ = endpoint_with([p.encode(9, p.Ping())])
    node.read_ready()
    assert transport._first_answer(None, master, [node], 9, lambda rid, reply: False) is None
    assert not node.has(9)  # dropped, not left to be taken later
    node, _ = endpoint_with([p.encode(9, p.Ping())])
    node.read_ready()
    reply = transport._first_answer(None, master, [node], 9, lambda rid, reply: True)
    assert isinstance(reply, p.Ping) and 9 in master._forgotten
    node.version_refused = p.Error("version", "refused")  # a refusal of every request there
    assert transport._first_answer(None, master, [node], 10, lambda rid, reply: True) is None
