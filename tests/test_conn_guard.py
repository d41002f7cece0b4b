"""The connection guard (blizzard/server/conn_guard.py): caps on what a server socket accepts."""

from __future__ import annotations

import socket
import time

import zmq

from blizzard.host.fd_limits import ConnectionBudget
from blizzard.local.harness import free_port
from blizzard.server.conn_guard import EVICT_AGE_S, Admission, Limits
from blizzard.server.router import RouterServer
from blizzard.wire import protocol as p

from support.wait import wait_for

LIMITS = Limits(max_open=10, max_pending=6, max_pending_per_addr=3, pending_s=5.0)


def test_pending_connections_are_capped_per_address_and_in_all():
    a = Admission(LIMITS)
    assert [a.admit(fd, "10.0.0.1", 0.0) for fd in (1, 2, 3)] == [(None, [])] * 3
    assert a.admit(4, "10.0.0.1", 0.1) == ("pending from one address", [])
    assert [a.admit(fd, "10.0.0.2", 0.2)[0] for fd in (5, 6, 7)] == [None] * 3
    assert a.admit(8, "10.0.0.3", 0.3) == ("pending", [])  # six pending in all
    assert a.refused == {"pending from one address": 1, "pending": 1}
    assert sorted(a.open) == [1, 2, 3, 5, 6, 7]


def test_a_connection_pends_until_a_message_proves_it():
    a = Admission(LIMITS)
    for fd in (1, 2, 3):
        assert a.admit(fd, "10.0.0.1", 0.0)[0] is None
    assert a.admit(4, "10.0.0.1", 0.0)[0] == "pending from one address"
    a.established(1)  # the server read a request from 1
    assert a.admit(4, "10.0.0.1", 0.0)[0] is None
    assert a.admit(5, "10.0.0.1", 0.0)[0] == "pending from one address"
    assert sorted(a.open) == [1, 2, 3, 4]


def test_the_oldest_pending_connection_makes_way_by_age_however_busy_it_is():
    """Pending connections are evicted for a newcomer by age alone: one trickling a byte at a
    time is no more a client than a silent one."""
    a = Admission(LIMITS)
    for fd, at in ((1, 0.0), (2, 0.1), (3, 0.2)):
        a.admit(fd, "10.0.0.1", at)
    assert a.admit(4, "10.0.0.1", EVICT_AGE_S - 0.01) == ("pending from one address", [])
    assert a.admit(5, "10.0.0.1", EVICT_AGE_S + 0.1) == (None, [1])
    assert a.admit(6, "10.0.0.1", EVICT_AGE_S + 0.15) == (None, [2])
    a.established(6)
    assert a.admit(7, "10.0.0.1", EVICT_AGE_S + 0.15) == (None, [])
    # at the global cap the oldest of any address goes, never a proven one
    for fd in (8, 9):
        a.admit(fd, "10.0.0.2", EVICT_AGE_S + 0.2)  # pending: 3 5 7 8 9
    assert len(a.pending) == 5 and a.admit(10, "10.0.0.3", EVICT_AGE_S + 0.3)[0] is None
    assert a.admit(11, "10.0.0.3", EVICT_AGE_S + 0.3) == (None, [3])
    assert a.evicted == 3 and 6 in a.open


def test_old_connections_pend_no_more_and_closed_ones_are_forgotten():
    a = Admission(LIMITS)
    for fd in (1, 2, 3):
        a.admit(fd, "10.0.0.1", 0.0)
    assert a.admit(4, "10.0.0.1", LIMITS.pending_s)[0] is None  # 1-3 are past the limit
    a.forget(4)
    a.forget(4)  # twice: nothing more
    assert sorted(a.open) == [1, 2, 3]
    assert a.admit(1, "10.0.0.9", 6.0)[0] is None  # a reused descriptor is a new connection
    assert a.open[1] == "10.0.0.9"


def test_open_connections_are_capped_by_the_descriptors_left_for_them():
    a = Admission(LIMITS)
    for fd in range(10):
        assert a.admit(fd, f"10.0.0.{fd}", 0.0)[0] is None
        a.established(fd)
    assert a.admit(10, "10.0.1.1", 0.0) == ("open", [])
    a.forget(3)
    assert a.admit(10, "10.0.1.1", 0.0)[0] is None


def test_the_open_cap_is_one_budget_for_every_socket_of_the_process():
    """Two sockets of one process (a master's requests and its heads feed) share the cap on
    open connections: together they never take the descriptors kept for files."""
    budget = ConnectionBudget()
    router, feed = Admission(LIMITS, budget), Admission(LIMITS, budget)
    for fd in range(6):
        assert router.admit(fd, f"10.0.0.{fd}", 0.0)[0] is None
        router.established(fd)
    for fd in range(4):
        assert feed.admit(100 + fd, f"10.0.1.{fd}", 0.0)[0] is None
        feed.established(100 + fd)
    assert budget.used == 10
    assert feed.admit(200, "10.0.2.1", 0.0) == ("open", [])
    assert router.admit(300, "10.0.2.2", 0.0) == ("open", [])
    router.forget(0)
    assert feed.admit(200, "10.0.2.1", 0.0)[0] is None
    feed.forget_all()  # its socket closed
    assert budget.used == 5


def _ping(sock: zmq.Socket, rid: int) -> None:
    sock.send(p.encode(rid, p.Ping()))


def _shut_by_server(conn: socket.socket) -> bool:
    """The server ended this connection (EOF or reset), after the greeting it may have sent."""
    conn.settimeout(0.01)
    try:
        while True:
            if not conn.recv(4096):
                return True
    except TimeoutError:
        return False
    except OSError:
        return True


def test_a_flood_of_idle_connections_is_cut_to_the_cap_and_real_clients_go_on():
    """Given a server with a client connected, when 300 idle TCP connections from one address
    are held open, then all but the per-address cap are shut at once, the connected client is
    answered meanwhile, and once the flood ends a new client connects and is answered."""
    ctx = zmq.Context.instance()
    port = free_port()
    addr = f"tcp://127.0.0.1:{port}"
    server = RouterServer(ctx, addr)
    assert server.guard is not None
    cap = server.guard.admission.limits.max_pending_per_addr
    client = ctx.socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    client.connect(addr)
    flood: list[socket.socket] = []
    late = None
    try:
        _ping(client, 1)
        assert [rid for _, rid, _ in server.receive(5000)] == [1]
        for _ in range(300):
            flood.append(socket.create_connection(("127.0.0.1", port)))
        wait_for(lambda: server.guard.shut >= 300 - cap, 10, "refusals")
        shut = [c for c in flood if _shut_by_server(c)]
        assert 300 - cap <= len(shut) < 300
        assert len(server.guard.admission.open) <= cap + 1  # the flood's, and the client

        _ping(client, 2)
        assert [rid for _, rid, _ in server.receive(5000)] == [2]

        for conn in flood:
            conn.close()
        wait_for(lambda: len(server.guard.admission.open) == 1, 10, "the flood's departures")
        late = ctx.socket(zmq.DEALER)
        late.setsockopt(zmq.LINGER, 0)
        late.connect(addr)
        _ping(late, 3)
        deadline = time.monotonic() + 10
        got: list[int] = []
        while not got and time.monotonic() < deadline:
            got = [rid for _, rid, _ in server.receive(200)]
        assert got == [3]
    finally:
        for conn in flood:
            conn.close()
        client.close()
        if late is not None:
            late.close()
        server.close()
    assert not server.guard.thread.is_alive()


def test_the_heads_feed_port_is_guarded_too():
    """The master's other port (``--heads-bind``, an XPUB) caps idle connections the same way,
    and still tells its subscribers' departures."""
    from support.in_process_master import in_process_master
    port = free_port()
    master = in_process_master(replication=1, heads_bind=f"tcp://127.0.0.1:{port}")
    flood: list[socket.socket] = []
    try:
        guard = master.heads.departures.guard
        cap = guard.admission.limits.max_pending_per_addr
        for _ in range(cap + 50):
            flood.append(socket.create_connection(("127.0.0.1", port)))
        wait_for(lambda: guard.shut >= 50, 10, "refusals")
        assert sum(_shut_by_server(c) for c in flood) >= 50
        for conn in flood:
            conn.close()
        wait_for(lambda: not guard.admission.open, 10, "the flood's departures")
        assert len(master.heads.departures.read()) >= cap  # told to the heads feed too
    finally:
        for conn in flood:
            conn.close()
        master.close()


def test_a_burst_of_real_clients_from_one_address_is_served(tmp_path):
    """300 CURVE clients from 127.0.0.1 connecting at once pass the per-address cap on pending
    connections (64): those shut while the others greet connect again, their requests kept."""
    from blizzard.net import keys as k
    from blizzard.net.secure import connect_curve, guard
    keys = str(tmp_path / "keys")
    k.generate(keys)
    server_ctx, client_ctx = zmq.Context(), zmq.Context()
    addr = f"tcp://127.0.0.1:{free_port()}"
    server = RouterServer(server_ctx, addr, keys=k.ServerKeys.from_dir(keys, "master"))
    mine = k.ClientKeys.from_dir(keys, "client")
    clients = []
    try:
        for rid in range(1, 301):
            sock = client_ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            connect_curve(sock, mine, mine.master)
            sock.connect(addr)
            _ping(sock, rid)
            clients.append(sock)
        answered: set[int] = set()
        deadline = time.monotonic() + 30
        while len(answered) < 300 and time.monotonic() < deadline:
            answered |= {rid for _, rid, _ in server.receive(100)}
        assert len(answered) == 300
    finally:
        for sock in clients:
            sock.close()
        server.close()
        guard(server_ctx, keys).stop()
        client_ctx.term()
        server_ctx.term()
