"""The beanstalkd gateway under hostile and unlucky clients (found by a review): a reserve
whose connection closed, trickled bodies, running out of descriptors, a slow reader, many
connections, failed settlements, protocol corners (kick 0, delays past a year), and the admin
key that kick and deletes of unreserved jobs need. Each test asserts what beanstalkd
(doc/protocol.txt) or the gateway's docs promise."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import threading
import time

import pytest

from blizzard import Client
from blizzard.gateways import beanstalk_session as bgw
from blizzard.gateways.beanstalkd import BeanstalkdGateway, GatewayConfig
from blizzard.local.harness import free_port
from blizzard.net import keys as k

from support.gateway import gateway_process, listening
from support.wait import wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture
def make_gw(cluster_factory, monkeypatch):
    monkeypatch.delenv(k.ENV, raising=False)
    made = []

    def make(**kw):
        cluster = cluster_factory(datanodes=1, replication=1, keys=None)
        gw = BeanstalkdGateway(GatewayConfig(cluster.master_addr, "127.0.0.1", 0, **kw))
        thread = threading.Thread(target=gw.serve_forever, daemon=True)
        thread.start()
        gw.cluster, gw.thread = cluster, thread
        made.append(gw)
        return gw

    yield make
    for gw in made:
        gw.stop()
        gw.thread.join(10)


def raw(gw) -> socket.socket:
    return raw_port(gw.port)


def raw_port(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def reply(sock: socket.socket, data: bytes) -> bytes:
    """Send ``data``, read one reply line (and its body, if it announces one)."""
    sock.sendall(data)
    buf = b""
    while b"\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return buf
        buf += chunk
    head = buf[:buf.index(b"\r\n")]
    words = head.split()
    if words and words[0] in (b"RESERVED", b"FOUND", b"OK"):
        need = len(head) + 2 + int(words[-1]) + 2
        while len(buf) < need:
            buf += sock.recv(65536)
    return buf


# -- leaks ---------------------------------------------------------------------------------------

def test_a_reserve_whose_connection_closed_ends_its_session(make_gw):
    """beanstalkd drops a waiting reserve when its connection closes: so does the gateway, and
    its --max-connections slot is free again."""
    gw = make_gw(max_connections=4)
    for _ in range(4):
        s = raw(gw)
        s.sendall(b"reserve\r\n")
        s.close()
    wait_for(lambda: gw.connections == 4 and not gw.sessions, timeout_s=10,
             what="the four sessions taken up, then ended with their connections")
    s = raw(gw)  # and the gateway still takes connections
    try:
        assert reply(s, b"list-tube-used\r\n") == b"USING default\r\n"
    finally:
        s.close()


def test_a_body_trickled_forever_is_cut_off(make_gw, monkeypatch):
    """The module docstring: 'a line or body started and not finished within LINE_TIMEOUT_S
    closes the connection'. Checked only when a recv times out (POLL_S, 0.5 s): a byte every
    0.3 s keeps a put (or a JOB_TOO_BIG skip of 2**64-1 bytes) open for ever."""
    monkeypatch.setattr(bgw, "LINE_TIMEOUT_S", 1.0)
    gw = make_gw(max_job_bytes=1024)
    s = raw(gw)
    try:
        s.sendall(b"put 0 0 10 1000\r\n")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                s.sendall(b"x")
            except OSError:
                break  # cut off: as promised
            time.sleep(0.3)
        else:
            s.settimeout(0.2)
            try:
                closed = s.recv(1) == b""
            except (TimeoutError, OSError):
                closed = False
            assert closed, "a body trickled for 5 s outlived LINE_TIMEOUT_S = 1 s"
    finally:
        s.close()


def test_running_out_of_file_descriptors_does_not_stop_the_gateway(cluster_factory, monkeypatch):
    """accept() failing with EMFILE (a process limited to 64 descriptors, 100 connections) is
    waited out: once the connections close, the gateway serves again."""
    monkeypatch.delenv(k.ENV, raising=False)
    cluster = cluster_factory(datanodes=1, replication=1, keys=None)
    port = free_port()

    def low_fd_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    proc = gateway_process(cluster.master_addr, port, preexec_fn=low_fd_limit)
    socks: list[socket.socket] = []
    try:
        wait_for(lambda: listening(port), what="the gateway to listen")
        for _ in range(100):  # under --max-connections (1024), over the process's 64 fds
            try:
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            except OSError:
                break
        for s in socks:
            s.close()

        def serves() -> bool:
            assert proc.poll() is None, "the gateway exited: " + proc.stderr.read().decode()[-600:]
            try:
                with raw_port(port) as s:
                    return reply(s, b"put 0 0 10 2\r\nok\r\n").startswith(b"INSERTED")
            except OSError:
                return False
        wait_for(serves, what="the gateway to serve again")
    finally:
        for s in socks:
            s.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

def test_a_slow_reader_still_gets_its_job(make_gw):
    """sendall under the 0.5 s socket timeout: a reply that takes longer than 0.5 s to drain
    (a big job, a slow or distant client) closes the connection; beanstalkd has no such limit."""
    gw = make_gw(max_job_bytes=8 * 1024 * 1024)
    body = b"x" * (8 * 1024 * 1024)
    p = raw(gw)
    c = socket.socket()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c.settimeout(10)
    c.connect(("127.0.0.1", gw.port))
    try:
        assert reply(p, b"put 0 0 10 %d\r\n" % len(body) + body + b"\r\n").startswith(b"INSERTED")
        c.sendall(b"reserve-with-timeout 5\r\n")
        time.sleep(1.5)  # a reader busy for a moment
        got, need = b"", len(b"RESERVED 1 %d\r\n" % len(body)) + len(body) + 2
        while len(got) < need:
            chunk = c.recv(1 << 20)
            if not chunk:
                break
            got += chunk
            time.sleep(0.001)
        assert got.startswith(b"RESERVED") and len(got) >= len(body), \
            f"connection closed after {len(got)} bytes of an {len(body)}-byte job"
    finally:
        p.close()
        c.close()


# -- protocol ------------------------------------------------------------------------------------

def test_kick_zero_kicks_nothing(make_gw):
    gw = make_gw()
    s = raw(gw)
    try:
        assert reply(s, b"kick 0\r\n") == b"KICKED 0\r\n"  # observed: INTERNAL_ERROR
    finally:
        s.close()


def test_delay_up_to_2_32_minus_1_is_accepted(make_gw):
    gw = make_gw()
    s = raw(gw)
    try:
        assert reply(s, b"put 0 4294967295 10 1\r\nx\r\n").startswith(b"INSERTED")
    finally:
        s.close()


def test_a_release_that_fails_leaves_the_job_reserved_by_its_connection(make_gw, monkeypatch):
    """A settlement the cluster could not make (here a release, failing once) leaves the job
    this connection's: it can still delete it, and would give it back at its close."""
    from blizzard.client.leases import Leases
    from blizzard.wire.errors import MasterUnavailable

    gw = make_gw()
    s = raw(gw)
    try:
        job = int(reply(s, b"put 0 0 10 1\r\nx\r\n").split()[1])
        assert reply(s, b"reserve-with-timeout 5\r\n").startswith(b"RESERVED %d " % job)

        def down(self, *args, **kw):
            raise MasterUnavailable("the master is away (a test)")
        nack = Leases.nack_ids
        monkeypatch.setattr(Leases, "nack_ids", down)
        assert reply(s, b"release %d 0 5\r\n" % job) == b"INTERNAL_ERROR\r\n"
        monkeypatch.setattr(Leases, "nack_ids", nack)
        assert reply(s, b"delete %d\r\n" % job) == b"DELETED\r\n"
    finally:
        s.close()

def test_delete_a_buried_job(make_gw):
    gw = make_gw()
    s = raw(gw)
    try:
        job = int(reply(s, b"put 0 0 10 1\r\nx\r\n").split()[1])
        assert reply(s, b"reserve-with-timeout 5\r\n").startswith(b"RESERVED")
        assert reply(s, b"bury %d 0\r\n" % job) == b"BURIED\r\n"
        assert reply(s, b"delete %d\r\n" % job) == b"DELETED\r\n"
    finally:
        s.close()


def test_delete_after_the_lease_ran_out_and_another_deleted_it(make_gw):
    gw = make_gw()
    with Client(gw.cluster.master_addr, timeout_s=10) as native:
        native.configure_queue("short", lease_s=1.0)
    a, b = raw(gw), raw(gw)
    try:
        reply(a, b"use short\r\n")
        reply(a, b"watch short\r\n")
        reply(b, b"watch short\r\n")
        job = int(reply(a, b"put 0 0 10 1\r\nx\r\n").split()[1])
        assert reply(a, b"reserve-with-timeout 5\r\n").startswith(b"RESERVED")
        # NOT_FOUND while a holds it; DELETED once its lease ran out
        wait_for(lambda: reply(b, b"delete %d\r\n" % job) == b"DELETED\r\n", timeout_s=10,
                 what="the job free to delete once a's lease ran out")
        assert reply(a, b"delete %d\r\n" % job) == b"NOT_FOUND\r\n"
    finally:
        a.close()
        b.close()


def test_peek_ready_of_an_unknown_tube(make_gw):
    gw = make_gw()
    s = raw(gw)
    try:
        reply(s, b"use never-used\r\n")
        assert reply(s, b"peek-ready\r\n") == b"NOT_FOUND\r\n"
    finally:
        s.close()


def test_pipelined_commands(make_gw):
    gw = make_gw()
    s = raw(gw)
    try:
        s.sendall(b"use p\r\nwatch p\r\nput 0 0 10 1\r\nx\r\nreserve-with-timeout 0\r\n")
        got = b""
        deadline = time.monotonic() + 10
        while got.count(b"\r\n") < 5 and time.monotonic() < deadline:
            got += s.recv(4096)
        assert got.startswith(b"USING p\r\nWATCHING 2\r\nINSERTED 1\r\nRESERVED 1 1\r\nx\r\n")
    finally:
        s.close()


def test_many_connections_each_with_a_client(make_gw):
    """One Client (a zmq socket to the master, one per data node) per connection, on the
    shared zmq context (MAX_SOCKETS 1023): far under --max-connections, a put fails with a
    ZMQError, which kills the session with a traceback instead of an answer."""
    gw = make_gw(max_connections=1024)
    socks = []
    try:
        for i in range(560):
            s = raw(gw)
            socks.append(s)
            r = reply(s, b"put 0 0 10 1\r\nx\r\n")
            assert r.startswith(b"INSERTED"), f"connection {i}: {r!r}"
    finally:
        for s in socks:
            s.close()


def test_on_a_secure_cluster_kick_and_delete_need_the_admin_key(cluster_factory):
    """Kick (a redrive) and deleting a job nobody reserved are admin operations: with the
    client key they answer INTERNAL_ERROR and change nothing; with --admin they work."""
    cluster = cluster_factory(datanodes=1, replication=1)  # secure: the session's keys
    assert os.environ.get(k.ENV)
    for admin in (False, True):
        gw = BeanstalkdGateway(GatewayConfig(cluster.master_addr, "127.0.0.1", 0, admin=admin))
        thread = threading.Thread(target=gw.serve_forever, daemon=True)
        thread.start()
        s = raw(gw)
        try:
            job = int(reply(s, b"put 0 0 10 1\r\nx\r\n").split()[1])
            assert reply(s, b"reserve-with-timeout 5\r\n").startswith(b"RESERVED %d " % job)
            assert reply(s, b"bury %d 0\r\n" % job) == b"BURIED\r\n"
            if admin:
                assert reply(s, b"kick 1\r\n") == b"KICKED 1\r\n"
                assert reply(s, b"delete %d\r\n" % job) == b"DELETED\r\n"
            else:
                assert reply(s, b"kick 1\r\n") == b"INTERNAL_ERROR\r\n"
                assert reply(s, b"delete %d\r\n" % job) == b"INTERNAL_ERROR\r\n"
                with Client(cluster.master_addr, timeout_s=10, admin=True) as native:
                    native.redrive("default")  # leave the tube empty for the next round
                    leftover = native.dequeue("default", wait_s=5)
                    assert leftover is not None and leftover.id == job
                    leftover.ack(wait=True)
        finally:
            s.close()
            gw.stop()
            thread.join(10)
