"""Security: CURVE keys on every connection, roles, clear errors, rotation without downtime.

Real processes on loopback with real keys; each test says what an attacker or a confused
operator would try and checks it is refused with a clear error, changing nothing.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time

import pytest

from blizzard import Client
from blizzard.local.harness import free_port
from blizzard.net import keys as k
from blizzard.net.transport import call
from blizzard.wire import protocol as p
from blizzard.wire.errors import AuthenticationFailed, Forbidden


def test_generated_keys_are_private_and_complete(tmp_path):
    directory = str(tmp_path / "keys")
    assert sorted(k.generate(directory)) == sorted(k.PARTIES)
    assert k.generate(directory) == []  # a second run keeps every pair
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    for name in os.listdir(directory):
        assert stat.S_IMODE(os.stat(os.path.join(directory, name)).st_mode) == 0o600, name
    # the shared datanode pair is the nodes' server key: it lets nobody in (add-node does)
    assert sorted(k.authorized(directory).values()) == ["admin", "client", "master"]


def test_a_client_without_keys_is_refused_quickly_with_a_clear_error(cluster, monkeypatch):
    monkeypatch.delenv(k.ENV)
    started = time.monotonic()
    with pytest.raises(AuthenticationFailed, match="requires keys"):
        with Client(cluster.master_addr, timeout_s=5) as c:
            c.enqueue("q", b"x")
    assert time.monotonic() - started < 5  # within its timeout, not a hang


def test_an_unknown_client_key_is_refused(cluster, tmp_path):
    stranger = str(tmp_path / "stranger")
    k.generate(stranger)
    shutil.copy(os.path.join(cluster.keys, "master.key"), os.path.join(stranger, "master.key"))
    with pytest.raises(AuthenticationFailed, match="refused this process's key"):
        with Client(cluster.master_addr, timeout_s=5, keys=stranger) as c:
            c.enqueue("q", b"x")


def test_a_master_with_another_key_is_not_trusted(cluster, tmp_path):
    forged = str(tmp_path / "forged")
    shutil.copytree(cluster.keys, forged)
    os.remove(os.path.join(forged, "master.key"))
    os.remove(os.path.join(forged, "master.key_secret"))
    k.generate(forged)  # a master key pair that is not the cluster's
    with pytest.raises(AuthenticationFailed, match="public key is not the one"):
        with Client(cluster.master_addr, timeout_s=5, keys=forged) as c:
            c.enqueue("q", b"x")


def test_a_client_key_cannot_act_as_a_data_node(cluster):
    ep = cluster.endpoint(cluster.master_addr, "client")
    try:
        for msg in [p.Heartbeat("dn-evil", "tcp://127.0.0.1:1", 0, 0, 10**12),
                    p.PutReport("dn-evil", [1], [], ""), p.Inventory("dn-evil", [], True),
                    p.Replicated("dn-evil", "dn-x", [1], [])]:
            with pytest.raises(Forbidden, match="only data nodes"):
                call(ep, msg, 5)
    finally:
        ep.close()
    assert "dn-evil" not in {n.node_id for n in cluster.status().nodes}


def test_a_data_node_key_cannot_act_as_a_client(cluster):
    ep = cluster.endpoint(cluster.master_addr, "datanode")
    try:
        for msg in [p.Place(1, []), p.Lease("q", 1, 1.0, 0.0, "", [], []), p.Purge("q")]:
            with pytest.raises(Forbidden):
                call(ep, msg, 5)
    finally:
        ep.close()


def test_only_an_admin_key_may_purge_redrive_or_reconfigure(cluster):
    with Client(cluster.master_addr, timeout_s=5) as c:
        c.enqueue("jobs", b"keep me")
        c.create_queue("own")  # creating a queue is a client's right
        for attempt in [lambda: c.purge("jobs"), lambda: c.redrive("jobs"),
                        lambda: c.configure_queue("jobs", max_attempts=1)]:
            with pytest.raises(Forbidden, match="admin key"):
                attempt()
        assert c.stats("jobs")["ready"] == 1
        assert c.queue_config("jobs")["max_attempts"] != 1
    with Client(cluster.master_addr, timeout_s=5, admin=True) as admin:
        assert admin.purge("jobs") == 1


def test_a_client_key_rotates_without_downtime(cluster_factory, tmp_path):
    keys = str(tmp_path / "keys")
    cl = cluster_factory(datanodes=2, replication=2, heartbeat_s=0.2, dead_after_s=1.5, keys=keys)
    old = k.ClientKeys.from_dir(keys)
    with Client(cl.master_addr, timeout_s=5, keys=old) as before:
        before.enqueue("r", b"1")
        k.rotate(keys, "client")
        new = k.ClientKeys.from_dir(keys)
        assert new.public != old.public
        with Client(cl.master_addr, timeout_s=5, keys=new) as after:  # no restart
            after.enqueue("r", b"2")
        before.enqueue("r", b"3")  # the old key still works during the rollover
        with Client(cl.master_addr, timeout_s=5, keys=old) as late:  # new connections too
            late.enqueue("r", b"4")
        k.retire(keys, "client")
        with pytest.raises(AuthenticationFailed):
            with Client(cl.master_addr, timeout_s=5, keys=old) as retired:
                retired.enqueue("r", b"5")
    with Client(cl.master_addr, timeout_s=5, keys=new) as c:
        got = c.dequeue_many("r", 10, wait_s=1)
        assert sorted(m.data for m in got) == [b"1", b"2", b"3", b"4"]
        c.ack_many(got)


@pytest.mark.cluster
def test_a_server_refuses_to_start_without_keys_or_insecure(tmp_path):
    env = {key: v for key, v in os.environ.items() if key != k.ENV}
    for module in ["master", "datanode"]:
        out = subprocess.run([sys.executable, "-m", module, "--data-dir", str(tmp_path / module),
                              "--bind", f"tcp://127.0.0.1:{free_port()}"],
                             capture_output=True, text=True, timeout=30, env=env)
        assert out.returncode == 2 and "--keys DIR" in out.stderr and "--insecure" in out.stderr
        missing = subprocess.run([sys.executable, "-m", module, "--data-dir",
                                  str(tmp_path / module), "--keys", str(tmp_path / "none")],
                                 capture_output=True, text=True, timeout=30, env=env)
        assert missing.returncode == 1 and "blizzard keys generate" in missing.stderr


def test_an_insecure_cluster_says_so(cluster_factory, monkeypatch):
    cl = cluster_factory(datanodes=1, replication=1, keys=None)
    monkeypatch.delenv(k.ENV)
    with Client(cl.master_addr, timeout_s=5) as c:
        assert c.status().secure is False
        c.enqueue("plain", b"x")
        msg = c.dequeue("plain")  # its read grant is unsigned: nothing checks it
        assert msg.data == b"x" and msg.ack(wait=True) is None
    assert "SECURITY IS OFF" in cl.master.tail() and "SECURITY IS OFF" in cl.nodes[0].tail()
    out = subprocess.run([sys.executable, "-m", "blizzard.cli", "status", "--master",
                          cl.master_addr], capture_output=True, text=True, timeout=30,
                         env={key: v for key, v in os.environ.items() if key != k.ENV})
    assert out.returncode == 0 and "security: OFF" in out.stdout


def test_status_shows_security_on(cluster):
    out = subprocess.run([sys.executable, "-m", "blizzard.cli", "status", "--master",
                          cluster.master_addr, "--keys", cluster.keys],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "security: on" in out.stdout, out.stderr


def test_the_client_learns_the_data_node_key_from_the_master(cluster):
    mine = k.ClientKeys.from_dir(cluster.keys)
    only_master = k.ClientKeys(mine.public, mine.secret, mine.master)  # as a user might give
    with Client(cluster.master_addr, timeout_s=5, keys=only_master) as c:
        item = c.enqueue("q", b"hello")
        got = c.dequeue("q", wait_s=1)
        assert got is not None and (got.id, got.data) == (item, b"hello")
        got.ack(wait=True)


@pytest.mark.cluster
def test_the_keys_command_generates_rotates_and_retires(tmp_path):
    directory = str(tmp_path / "keys")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "blizzard.cli", "keys", *args],
                              capture_output=True, text=True, timeout=30)
    assert run("generate", directory).returncode == 0
    assert run("rotate", directory, "client").returncode == 0
    listed = run("list", directory).stdout
    assert listed.count("client ") == 2 and "client.old.key" in listed
    assert run("rotate", directory, "client").returncode == 1  # retire the old one first
    assert run("rotate", directory, "datanode").returncode == 2  # a server key: not live
    assert run("retire", directory, "client").returncode == 0
    assert run("list", directory).stdout.count("client ") == 1
    assert run("retire", directory, "client").returncode == 1


# -- what a review found: each a way around the rules, now closed --------------------------


def test_a_routing_id_once_used_by_an_admin_gives_no_admin_rights(cluster):
    import zmq
    rid = b"\x00\x11\x22\x33\x44"
    admin = cluster.dealer(cluster.master_addr, "admin")
    admin.close(linger=0)
    admin = zmq.Context.instance().socket(zmq.DEALER)
    admin.setsockopt(zmq.LINGER, 0)
    admin.setsockopt(zmq.ROUTING_ID, rid)
    mine = k.ClientKeys.from_dir(cluster.keys, "admin")
    from blizzard.net.secure import connect_curve
    connect_curve(admin, mine, mine.master)
    admin.connect(cluster.master_addr)
    admin.send(p.encode(1, p.Ping()))
    assert admin.poll(5000)
    admin.close(linger=0)
    with Client(cluster.master_addr, timeout_s=5) as c:
        c.enqueue("kept", b"x")
    sneak = zmq.Context.instance().socket(zmq.DEALER)
    sneak.setsockopt(zmq.LINGER, 0)
    sneak.setsockopt(zmq.ROUTING_ID, rid)
    client = k.ClientKeys.from_dir(cluster.keys)
    connect_curve(sneak, client, client.master)
    sneak.connect(cluster.master_addr)
    try:
        sneak.send(p.encode(2, p.Purge("kept")))
        assert sneak.poll(5000)
        _, reply = p.decode(sneak.recv())
        assert isinstance(reply, p.Error) and reply.code == "forbidden"
    finally:
        sneak.close(linger=0)
    with Client(cluster.master_addr, timeout_s=5) as c:
        assert c.stats("kept")["ready"] == 1


def test_a_server_that_drops_a_greeting_as_it_restarts_is_a_timeout_not_a_key_error():
    import socket
    import threading

    import zmq

    from blizzard.net.transport import Endpoint
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)

    def drop_one_then_go() -> None:  # a server dying mid-greeting, not back yet
        conn, _ = listener.accept()
        conn.close()
        listener.close()
    thread = threading.Thread(target=drop_one_then_go, daemon=True)
    thread.start()
    ep = Endpoint(zmq.Context.instance(), f"tcp://127.0.0.1:{listener.getsockname()[1]}")
    try:
        with pytest.raises(TimeoutError):
            call(ep, p.Ping(), 1.0)
    finally:
        thread.join(2)
        ep.close()


def test_the_key_directory_going_away_does_not_lock_everyone_out(cluster_factory, tmp_path):
    keys = str(tmp_path / "keys")
    cl = cluster_factory(datanodes=1, replication=1, keys=keys)
    mine = k.ClientKeys.from_dir(keys)
    os.rename(keys, keys + ".moved")
    try:
        with Client(cl.master_addr, timeout_s=5, keys=mine) as c:  # the keys read last hold
            c.enqueue("q", b"1")
    finally:
        os.rename(keys + ".moved", keys)
    with Client(cl.master_addr, timeout_s=5, keys=mine) as c:
        c.enqueue("q", b"2")
        assert c.stats("q")["ready"] == 2


def test_a_client_key_cannot_peek_report_bad_replicas_forward_or_enqueue_others_ids(cluster):
    with Client(cluster.master_addr, timeout_s=5) as c:
        item = c.enqueue("mine", b"payload")
        with pytest.raises(Forbidden, match="admin key"):
            c.peek("mine")
        holders = cluster.status().nodes  # the item's replicas are among them
        ep = cluster.endpoint(cluster.master_addr)
        try:  # a report on an item nobody leased drops no replica
            call(ep, p.BadReplica([item] * len(holders), [h.node_id for h in holders]), 5)
            assert cluster.status().under_replicated == 0
            theirs = call(ep, p.Place(1, []), 5)  # another client's ids and grant
            mine = call(ep, p.Place(1, []), 5)
            with pytest.raises(Forbidden, match="does not cover"):
                call(ep, p.Enqueue("stolen", theirs.ids, [1], [0], [0], [0.0], [""], False,
                                   "steal-1", False, 1.0, mine.grant), 5)
        finally:
            ep.close()
        node = mine.nodes[0]
        other = next(n for n in cluster.nodes if n.addr != node.addr)
        ep = cluster.endpoint(node.addr)
        try:  # a put naming a replica its grant does not: refused, not relayed
            with pytest.raises(Forbidden, match="forward"):
                call(ep, p.Put(mine.ids, [b"x"], [0x8CDC1683],
                               [p.NodeRef("dn-any", other.addr)], 1, node.node_id, False,
                               mine.grant), 5)
        finally:
            ep.close()
        got = c.dequeue("mine", wait_s=1)
        assert got is not None and got.id == item and got.data == b"payload"
        got.ack(wait=True)
