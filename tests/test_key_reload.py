"""A key directory that cannot be read revokes no key (blizzard/net/keys.py, secure.py), and a
server's connections together leave its files their descriptors (fd_limits.py).

A reload under EMFILE once read "no keys" (``glob`` answers [] for a directory it cannot
open; every other OSError was taken for a half-written file): every open connection was then
told its key was revoked, the data nodes were declared dead and new clients refused, until a
later reload. A master's requests port and heads feed could each take the soft limit less
the reserve, together more than the process had, so a flood left no descriptor to read with.
"""

from __future__ import annotations

import errno
import os
import re
import resource
import selectors
import socket
import threading
import time

from blizzard import Client
from blizzard.local.harness import free_port
from blizzard.net import keys as k
from blizzard.net.secure import _Directory
from chaos.fuzz.floods import round_trip

from support.wait import wait_for

# A ZMTP greeting asking for CURVE and the header of a long frame, part of it sent: libzmq
# waits for the rest until its handshake limit (the guard once took these 323 bytes for a
# finished handshake and let them hold a descriptor each, uncapped)
GREETED = (b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"CURVE".ljust(20, b"\x00")
           + b"\x00" * 32 + b"\x06" + (1000).to_bytes(8, "big") + b"\x05HELLO" + b"\x00" * 244)


def _user_id(keys: str, name: str) -> str:
    role = "client" if name == "client" else "node"
    return f"{role}:{k.load_public(keys, name).decode()}"


def test_a_reload_without_descriptors_keeps_the_keys_it_had(tmp_path):
    """Given the keys read from a directory, when the directory changes while this process
    has no descriptor left (a real EMFILE), then every key stays admitted, the failure is
    logged, and the reading is done once descriptors are back (a key removed meanwhile is
    then gone)."""
    keys = str(tmp_path / "keys")
    k.generate(keys)
    k.add_node(keys, "n0")
    k.add_node(keys, "n1")
    directory = _Directory(keys)
    client, n0, n1 = (_user_id(keys, n) for n in ("client", "datanode-n0", "datanode-n1"))
    assert directory.current(client) and directory.current(n0)

    k.remove_node(keys, "n1")  # changes the directory: the next look reads it again
    st = os.stat(keys)
    os.utime(keys, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 16, hard))
    try:
        try:
            for _ in range(highest + 17):  # bounded: fewer are free under the lowered limit
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as exc:
            assert exc.errno == errno.EMFILE
        else:
            raise AssertionError("the lowered limit left descriptors free")
        directory.checked_at = 0.0
        during = [directory.current(u) for u in (client, n0, n1)]
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert during == [True, True, True]  # the keys read before: none revoked
    assert directory.failures.total == {"unreadable": 1}

    directory.checked_at = 0.0
    assert directory.current(client) and directory.current(n0)
    assert not directory.current(n1)  # read again once it could be: removed


def _raise_own_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard == resource.RLIM_INFINITY or hard >= need, f"need {need} descriptors"
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


class _GreetedFlood:
    """``hold`` connections to each port, from 127.0.0.2-9, each sending ``GREETED`` and
    waiting; one made again for each the server ends. Bounded by ``seconds``."""

    def __init__(self, ports: list[int], hold: int) -> None:
        self.ports, self.hold = ports, hold
        self.made = {port: 0 for port in ports}
        self.shut = {port: 0 for port in ports}
        self.stop = threading.Event()

    def run(self, seconds: float) -> None:
        sel = selectors.DefaultSelector()
        held = {port: 0 for port in self.ports}
        deadline = time.monotonic() + seconds
        made = 0
        try:
            while time.monotonic() < deadline and not self.stop.is_set():
                for port in self.ports:
                    for _ in range(min(50, self.hold - held[port])):  # at most 50 a pass each
                        s = socket.socket()
                        s.bind((f"127.0.0.{2 + made % 8}", 0))
                        made += 1
                        try:
                            s.connect(("127.0.0.1", port))
                            s.sendall(GREETED)
                        except OSError:
                            s.close()
                            continue
                        s.setblocking(False)
                        sel.register(s, selectors.EVENT_READ, port)
                        held[port] += 1
                        self.made[port] += 1
                for key, _ in sel.select(0.05):
                    try:
                        if key.fileobj.recv(4096):
                            continue
                    except BlockingIOError:
                        continue
                    except OSError:
                        pass
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
                    held[key.data] -= 1
                    self.shut[key.data] += 1
        finally:
            for key in list(sel.get_map().values()):
                key.fileobj.close()
            sel.close()


def test_a_key_reload_during_a_flood_on_both_ports_under_a_low_limit_revokes_nothing(
        cluster_factory, tmp_path):
    """Given a secure master with a heads feed and one data node, all under a descriptor
    limit of 600, and a client connected, when both of the master's ports are flooded with
    connections that send a greeting and a frame header (400 held to each) and the key
    directory changes meanwhile (a node key added), then the master reads the new keys (its
    connections left its files descriptors), the client's open connection and its data node
    work on, and nothing was revoked."""
    _raise_own_limit(3000)
    keys = str(tmp_path / "keys")
    heads_port = free_port()
    cluster = cluster_factory(keys=keys, datanodes=1, replication=1, heartbeat_s=0.2,
                              dead_after_s=2.0, nofile=600,
                              master_args=["--heads-bind", f"tcp://127.0.0.1:{heads_port}"])
    master_port = int(cluster.master_addr.rsplit(":", 1)[1])
    with Client(cluster.master_addr, timeout_s=10, keys=keys) as client:
        round_trip(client, "rt", 0)
        reloads = len(re.findall(r"\d+ keys allowed", cluster.master.tail(200_000)))
        flood = _GreetedFlood([master_port, heads_port], hold=400)
        thread = threading.Thread(target=flood.run, args=(25.0,), daemon=True)
        thread.start()
        try:
            pid = cluster.master.popen.pid

            def flooded() -> bool:  # all held, and either cut back or the master's limit hit
                return min(flood.made.values()) >= 400 and (
                    sum(flood.shut.values()) >= 400 or len(os.listdir(f"/proc/{pid}/fd")) >= 590)
            wait_for(flooded, 20, "the flood to offer each port more than the process may open")
            k.add_node(keys, "late")  # the directory changes: every server reads it again
            wait_for(lambda: len(re.findall(r"\d+ keys allowed",
                                            cluster.master.tail(200_000))) > reloads
                     or "cannot read the key directory" in cluster.master.tail(200_000), 10,
                     "the master to read its key directory again")
            for n in range(1, 6):  # meanwhile the node heartbeats: a revoked key is dead soon
                round_trip(client, "rt", n)
            deadline = time.monotonic() + 2 * 2.0  # two of dead_after_s: a revoked node is dead
            while time.monotonic() < deadline:
                round_trip(client, "rt", 9)
        finally:
            flood.stop.set()
            thread.join(30)
        log = cluster.master.tail(200_000)
        assert "revoked" not in log
        assert not re.search(r"\b0 keys allowed", log)
        assert not re.search(r"data node \S+ is dead", log)
        assert flood.shut[master_port] + flood.shut[heads_port] >= 400  # the guards cut
    with Client(cluster.master_addr, timeout_s=10, keys=keys) as fresh:
        round_trip(fresh, "rt", 99)
    assert cluster.master.alive and all(node.alive for node in cluster.nodes)
