"""``blizzard beanstalkd``: a real beanstalkd client (greenstalk) against the gateway in front
of a real cluster; the protocol's errors; hostile connections cost bounded memory."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time

import greenstalk
import pytest

from blizzard import Client
from blizzard.local.harness import free_port
from blizzard.net import keys as k

from support.cli import BLIZZARD
from support.gateway import beanstalkd_on_new_cluster, gateway_process, listening
from support.sqs import boto
from support.wait import wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture
def gateway(cluster_factory, monkeypatch):
    yield from beanstalkd_on_new_cluster(cluster_factory, monkeypatch, max_connections=8,
                                         max_job_bytes=1024)


def connect(gw, **kw) -> greenstalk.Client:
    return greenstalk.Client(("127.0.0.1", gw.port), encoding=None, **kw)


def raw(gw) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    return sock


def ask(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    return sock.recv(4096)


def test_put_reserve_delete_round_trip_with_greenstalk(gateway):
    with connect(gateway, use="emails", watch="emails") as c:
        job_id = c.put(b"hello", priority=7, delay=0)
        job = c.reserve(timeout=10)
        assert (job.id, job.body) == (job_id, b"hello")
        assert c.stats_job(job)["state"] == "reserved"
        c.delete(job)
        with pytest.raises(greenstalk.TimedOutError):
            c.reserve(timeout=0)
    with Client(gateway.cluster.master_addr, timeout_s=10) as native:
        assert native.stats("emails")["ready"] == 0 and native.stats("emails")["leased"] == 0


def test_release_bury_kick_and_touch(gateway):
    with connect(gateway, use="jobs", watch="jobs") as c:
        c.put(b"one")
        job = c.reserve(timeout=10)
        c.touch(job)
        c.release(job)
        again = c.reserve(timeout=10)
        assert again.id == job.id
        c.bury(again)
        with pytest.raises(greenstalk.TimedOutError):
            c.reserve(timeout=0)
        assert c.stats_tube("jobs")["current-jobs-buried"] == 1
        with pytest.raises(greenstalk.NotFoundError):
            c.touch(again)  # no longer reserved
        c.kick(10)
        kicked = c.reserve(timeout=10)
        assert kicked.body == b"one"
        c.delete(kicked)


def test_priorities_order_jobs_as_beanstalkd_does(gateway):
    with connect(gateway, use="p", watch="p") as c:
        for pri, body in ((2**32 - 1, b"last"), (0, b"first"), (1000, b"middle")):
            c.put(body, priority=pri)
        got = []
        for _ in range(3):
            job = c.reserve(timeout=10)
            got.append(job.body)
            c.delete(job)
        assert got == [b"first", b"middle", b"last"]


def test_watch_and_ignore_tubes(gateway):
    with connect(gateway) as c:
        assert c.watch("a") == 2 and c.watch("b") == 3
        assert c.ignore("default") == 2
        c.use("b")
        c.put(b"in b")
        assert c.reserve(timeout=10).body == b"in b"
        assert c.ignore("a") == 1
        with pytest.raises(greenstalk.NotIgnoredError):
            c.ignore("b")  # the last tube watched
        assert c.using() == "b" and c.watching() == ["b"]


def test_a_job_reserved_by_one_connection_is_not_anothers_and_returns_when_it_closes(gateway):
    first, second = connect(gateway, use="x", watch="x"), connect(gateway, use="x", watch="x")
    try:
        job_id = first.put(b"mine")
        job = first.reserve(timeout=10)
        with pytest.raises(greenstalk.NotFoundError):
            second.delete(job_id)
        with pytest.raises(greenstalk.NotFoundError):
            second.release(job)
        with pytest.raises(greenstalk.TimedOutError):
            second.reserve(timeout=0)
        first.close()  # what it reserved goes back
        assert second.reserve(timeout=10).id == job_id
    finally:
        second.close()


def test_protocol_errors_change_nothing(gateway):
    sock = raw(gateway)
    try:
        assert ask(sock, b"frobnicate\r\n") == b"UNKNOWN_COMMAND\r\n"
        assert ask(sock, b"put 1 2\r\n") == b"BAD_FORMAT\r\n"
        assert ask(sock, b"put -1 0 10 1\r\n") == b"BAD_FORMAT\r\n"
        assert ask(sock, b"use bad tube\r\n") == b"BAD_FORMAT\r\n"
        assert ask(sock, b"put 0 0 10 5\r\nhelloXX") == b"EXPECTED_CRLF\r\n"
        assert ask(sock, b"put 0 0 10 2000\r\n" + b"x" * 2000 + b"\r\n") == b"JOB_TOO_BIG\r\n"
        assert ask(sock, b"delete 123456789\r\n") == b"NOT_FOUND\r\n"
        assert ask(sock, b"reserve-with-timeout 0\r\n") == b"TIMED_OUT\r\n"  # nothing was put
    finally:
        sock.close()


def test_hostile_connections_are_cut_off_and_bounded(gateway):
    long_line = raw(gateway)
    long_line.sendall(b"use " + b"a" * 10_000)  # a line that never ends
    assert long_line.recv(100) == b"BAD_FORMAT\r\n"
    assert long_line.recv(100) == b""  # and closed
    big = raw(gateway)  # a 2 GiB job: refused at once, its bytes dropped as they come
    assert ask(big, b"put 0 0 10 2147483648\r\n") == b"JOB_TOO_BIG\r\n"  # its bytes dropped
    socks = [raw(gateway) for _ in range(12)]  # over --max-connections (8, big's among them)

    def closed() -> int:  # connections the gateway closed at once
        n = 0
        for sock in socks:
            sock.setblocking(False)
            try:
                n += sock.recv(1) == b""
            except BlockingIOError:
                pass
        return n

    wait_for(lambda: closed() >= 12 - 7, what="the connections over the cap closed")
    assert len(gateway.sessions) <= 8
    for s in [long_line, big, *socks]:
        s.close()
    # until the gateway has seen them close, a new connection may still be over the cap
    wait_for(lambda: not gateway.sessions, what="closed connections to end")
    with connect(gateway, use="after", watch="after") as c:  # and it still serves
        c.put(b"ok")
        assert c.reserve(timeout=10).body == b"ok"


def test_the_cli_serves_until_ctrl_c(cluster_factory, monkeypatch):
    monkeypatch.delenv(k.ENV, raising=False)
    cluster = cluster_factory(datanodes=1, replication=1, keys=None)
    port = free_port()
    proc = gateway_process(cluster.master_addr, port)
    try:
        def served() -> bool:
            try:
                with greenstalk.Client(("127.0.0.1", port), encoding=None, use="cli") as c:
                    return c.put(b"via the cli") > 0
            except ConnectionError:
                return False
        wait_for(served, what="the gateway to accept a put")
        with greenstalk.Client(("127.0.0.1", port), encoding=None, watch="cli") as c:
            assert c.reserve(timeout=10).body == b"via the cli"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_deadline_soon_peek_buried_and_stats(gateway):
    with Client(gateway.cluster.master_addr, timeout_s=10) as native:
        native.create_queue("soon", lease_s=1.0)  # at the margin from the start
    with connect(gateway, use="soon", watch="soon") as c:
        c.put(b"a", ttr=1)
        c.put(b"b", ttr=1)
        job = c.reserve(timeout=10)
        with pytest.raises(greenstalk.DeadlineSoonError):
            c.reserve(timeout=0)
        c.bury(job)
        assert c.peek_buried().body == b"a"
        stats = c.stats()
        assert stats["current-connections"] == 1 and stats["version"].startswith("blizzard-")


def test_blizzard_cluster_serves_beanstalkd_and_sqs_with_the_admin_key(tmp_path):
    port, beans, sqs_port = free_port(), free_port(), free_port()
    env = dict(os.environ)
    env.pop(k.ENV, None)
    proc = subprocess.Popen([*BLIZZARD, "cluster", "--data-dir", str(tmp_path), "--datanodes",
                             "1", "--port", str(port), "--node-port", str(free_port()),
                             "--beanstalkd", str(beans), "--sqs", str(sqs_port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        def put() -> int | None:
            try:
                with greenstalk.Client(("127.0.0.1", beans), encoding=None, use="t") as c:
                    return c.put(b"via blizzard cluster")
            except (ConnectionError, greenstalk.Error):
                return None
        wait_for(lambda: put() is not None, timeout_s=60, what="the cluster's beanstalkd port")
        with greenstalk.Client(("127.0.0.1", beans), encoding=None, use="t", watch="t") as c:
            job = c.reserve(timeout=10)
            c.bury(job)
            assert c.kick(1) == 1  # the admin key: kick is a redrive
        sqs = boto(f"http://127.0.0.1:{sqs_port}")  # any access key: no --credentials here
        url = sqs.get_queue_url(QueueName="t")["QueueUrl"]  # the tube is the queue
        assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]["Body"] \
            == "via blizzard cluster"
        sqs.purge_queue(QueueUrl=url)  # the admin key
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert f"beanstalkd protocol on 127.0.0.1:{beans}" in out and "stopped" in out
        assert f"SQS API on http://127.0.0.1:{sqs_port}" in out
        for gateway_port in (beans, sqs_port):  # the gateways stopped too
            with pytest.raises(ConnectionError):
                socket.create_connection(("127.0.0.1", gateway_port), timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


def test_peek_by_id_peek_delayed_kick_job_and_reserve_job(gateway):
    with connect(gateway, use="byid", watch="byid") as c:
        ready = c.put(b"ready one")
        later = c.put(b"later one", delay=3600)
        assert c.peek(ready).body == b"ready one"
        assert c.peek_delayed().id == later
        assert c.peek(later).body == b"later one"
        with pytest.raises(greenstalk.NotFoundError):
            c.peek(10**15)
        c.kick_job(later)  # a delayed job: ready now
        with pytest.raises(greenstalk.NotFoundError):
            c.peek_delayed()
        job = c.reserve_job(later)  # by id, ahead of the older ready one
        assert (job.id, job.body) == (later, b"later one")
        assert c.peek(later).body == b"later one"  # a reserved job is still shown
        with pytest.raises(greenstalk.NotFoundError):
            c.reserve_job(later)  # reserved already
        c.bury(job)
        with pytest.raises(greenstalk.NotFoundError):
            c.kick_job(10**15)
        assert c.peek_buried().id == later
        c.kick_job(later)  # a buried job: back in its tube
        got = sorted(c.reserve(timeout=10).id for _ in range(2))
        assert got == sorted([ready, later])


def test_pause_tube_holds_its_jobs_for_every_connection(gateway):
    with connect(gateway, use="paused", watch="paused") as c, \
            connect(gateway, watch="paused") as other:
        c.put(b"waits")
        c.pause_tube("paused", 2)
        assert c.stats_tube("paused")["pause-time-left"] >= 1
        with pytest.raises(greenstalk.TimedOutError):
            other.reserve(timeout=0)  # paused: nothing is handed out
        job = other.reserve(timeout=10)  # until the pause ends
        assert job.body == b"waits"
        other.delete(job)


def test_a_jobs_own_ttr_release_and_bury_priorities(gateway):
    with connect(gateway, use="ttr", watch="ttr") as c:
        long_job = c.put(b"long", ttr=600)
        short_job = c.put(b"short", ttr=1)
        job = c.reserve(timeout=10)
        assert job.id == long_job
        assert c.stats_job(job)["ttr"] == 600  # its own, not the tube's 30 s
        other = c.reserve(timeout=10)
        assert other.id == short_job and c.stats_job(other)["ttr"] == 1
        with pytest.raises(greenstalk.DeadlineSoonError):
            c.reserve(timeout=10)  # a job held has less than a second left
        # the short one's lease (1 s) runs out: it is ready again; the long one is still held
        again = wait_for(lambda: _reserve_or_none(c), timeout_s=15, what="the short job again")
        assert again.id == short_job
        assert c.stats_job(long_job)["state"] == "reserved"
        c.touch(job)
        # release at a more urgent priority: served before an older job of the default one
        c.put(b"older")
        c.release(again, priority=0)
        first = c.reserve(timeout=10)
        assert first.id == short_job and c.stats_job(first)["pri"] == 0
        c.bury(first, priority=7)
        assert c.stats_job(first)["pri"] == 7 and c.stats_job(first)["state"] == "buried"
        c.delete(job)


def _reserve_or_none(c: greenstalk.Client) -> greenstalk.Job | None:
    try:
        return c.reserve(timeout=1)
    except (greenstalk.DeadlineSoonError, greenstalk.TimedOutError):
        return None


def test_a_reserve_over_several_tubes_takes_the_most_urgent_job(gateway):
    with connect(gateway, use="low") as c:
        c.put(b"not urgent", priority=1000)
        c.use("high")
        c.put(b"urgent", priority=1)
        c.watch("low")
        c.watch("high")
        c.ignore("default")
        first, second = c.reserve(timeout=10), c.reserve(timeout=10)
        assert (first.body, second.body) == (b"urgent", b"not urgent")


def test_puts_and_deletes_of_many_connections_at_once_each_get_their_own_answer(gateway):
    ids: list[int] = []
    start = threading.Barrier(8)

    def producer(k: int) -> None:
        with connect(gateway, use="many") as c:
            start.wait()
            for n in range(10):
                ids.append(c.put(f"{k}-{n}".encode(), priority=k))

    threads = [threading.Thread(target=producer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(set(ids)) == 80  # one id each, none shared
    reserved: list[int] = []
    together = threading.Barrier(4)

    def consumer() -> None:
        with connect(gateway, watch="many") as c:
            jobs = [c.reserve(timeout=10) for _ in range(20)]
            reserved.extend(j.id for j in jobs)
            together.wait()  # then all four delete at once: their acks go in batches
            for job in jobs:
                c.delete(job)
            with pytest.raises(greenstalk.NotFoundError):
                c.delete(jobs[0])  # deleted already

    threads = [threading.Thread(target=consumer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(reserved) == sorted(ids)
    with Client(gateway.cluster.master_addr, timeout_s=10) as native:
        assert native.stats("many")["ready"] == native.stats("many")["leased"] == 0


def test_a_named_lease_keeps_to_the_queues_pause_and_rate_limit(gateway):
    with Client(gateway.cluster.master_addr, timeout_s=10) as native:
        native.create_queue("limited", rate_per_s=0.001, burst=1)
        first, second = (native.enqueue("limited", b"a"), native.enqueue("limited", b"b"))
        one = native.leases.lease_columns("limited", 1, ids=[first])
        assert one.ids == [first]  # the one token
        assert native.leases.lease_columns("limited", 1, ids=[second]).ids == []  # none left
        native.configure_queue("limited", rate_per_s=0.0, paused_until=time.time() + 3600)
        assert native.leases.lease_columns("limited", 1, ids=[second]).ids == []  # paused
        native.configure_queue("limited", paused_until=0.0)
        assert native.leases.lease_columns("limited", 1, ids=[second]).ids == [second]


def test_peek_ready_shows_the_head_and_quit_closes(gateway):
    with connect(gateway, use="peeked", watch="peeked") as c:
        later = c.put(b"later", priority=10)
        first = c.put(b"first", priority=1)
        head = c.peek_ready()
        assert (head.id, head.body) == (first, b"first")  # the most urgent, not taken
        assert c.reserve(timeout=10).id == first
        assert c.peek_ready().id == later
    s = raw(gateway)
    try:
        s.sendall(b"quit\r\n")
        assert s.recv(100) == b""  # closed, nothing answered
    finally:
        s.close()


def _accepts(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def test_a_unix_socket_has_its_mode_is_refused_in_use_replaced_stale_and_removed_on_exit(
        cluster_factory, monkeypatch):
    monkeypatch.delenv(k.ENV, raising=False)
    cluster = cluster_factory(datanodes=2, replication=2, keys=None)
    where = tempfile.mkdtemp(prefix="bz-", dir="/tmp")  # (a socket's path is at most 107 bytes)
    path = os.path.join(where, "beanstalkd.sock")
    env = dict(os.environ, BLIZZARD_MASTER=cluster.master_addr)

    def start(*more: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([*BLIZZARD, "beanstalkd", "--listen", f"unix:{path}", *more],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def put_and_take(body: bytes) -> None:
        with greenstalk.Client(path, encoding=None) as c:  # greenstalk over the Unix socket
            job_id = c.put(body)
            job = c.reserve(timeout=10)
            assert (job.id, job.body) == (job_id, body)
            c.delete(job)

    try:
        gw = start("--socket-mode", "600")
        wait_for(lambda: _accepts(path), what="the gateway to listen on its socket")
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
        put_and_take(b"over a unix socket")
        second = start()  # a live server's socket is not taken over
        _, err = second.communicate(timeout=60)
        assert second.returncode == 2 and b"already listens on" in err, err
        put_and_take(b"the first one still serves")
        gw.send_signal(signal.SIGTERM)
        assert gw.wait(30) == 0
        assert not os.path.lexists(path)  # removed on exit
        gw = start()
        wait_for(lambda: _accepts(path), what="the gateway to listen again")
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o660  # the default mode
        gw.kill()  # SIGKILL leaves the socket file behind: stale
        gw.wait(30)
        assert os.path.lexists(path) and not _accepts(path)
        gw = start()
        wait_for(lambda: _accepts(path), what="a new gateway in place of the stale socket")
        put_and_take(b"after a stale socket")
        gw.send_signal(signal.SIGTERM)
        gw.wait(30)
        with open(path, "w") as f:  # anything that is not a socket is left alone
            f.write("not a socket")
        third = start()
        _, err = third.communicate(timeout=60)
        assert third.returncode == 2 and b"is not a socket" in err, err
        with open(path) as f:
            assert f.read() == "not a socket"
        os.unlink(path)
        target = os.path.join(where, "target")
        with open(target, "w") as f:
            f.write("kept")
        os.symlink(target, path)  # a link planted at the path is not followed nor replaced
        fourth = start()
        _, err = fourth.communicate(timeout=60)
        assert fourth.returncode == 2 and b"is not a socket" in err, err
        assert os.path.islink(path) and open(target).read() == "kept"
    finally:
        for proc in [p for p in locals().values() if isinstance(p, subprocess.Popen)]:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
        shutil.rmtree(where, ignore_errors=True)


@pytest.mark.parametrize("value, says", [("unix:", "needs a path"),
                                         ("unix:/tmp/" + "x" * 120, "under 91 bytes")])
def test_a_bad_unix_socket_path_is_refused_clearly(cluster_factory, monkeypatch, value, says):
    monkeypatch.delenv(k.ENV, raising=False)
    cluster = cluster_factory(datanodes=1, replication=1, keys=None)
    done = subprocess.run([*BLIZZARD, "beanstalkd", "--listen", value],
                          env=dict(os.environ, BLIZZARD_MASTER=cluster.master_addr),
                          capture_output=True, timeout=60)
    assert done.returncode == 2 and says.encode() in done.stderr, done.stderr


def test_sigusr1_puts_the_gateway_in_drain_mode(cluster_factory, monkeypatch):
    monkeypatch.delenv(k.ENV, raising=False)
    cluster = cluster_factory(datanodes=2, replication=2, keys=None)
    port = free_port()
    gw = gateway_process(cluster.master_addr, port)
    try:
        wait_for(lambda: listening(port), what="the gateway to listen")
        with greenstalk.Client(("127.0.0.1", port), encoding=None) as c:
            c.put(b"before")
            gw.send_signal(signal.SIGUSR1)
            wait_for(lambda: c.stats()["draining"] == "true", what="drain mode")
            with pytest.raises(greenstalk.DrainingError):
                c.put(b"after")
            job = c.reserve(timeout=10)  # the rest is served
            assert job.body == b"before"
            c.delete(job)
    finally:
        gw.terminate()
        gw.wait(30)
