"""A flood of plain TCP connections (no key) stops no server, even under a low descriptor limit
(issue 32 item 1): the servers cap what they accept, keep descriptors for their files, and
a WAL roll or a checkpoint during the flood goes through."""

from __future__ import annotations

import re
import resource
import threading
import time

from blizzard import Client
from chaos.fuzz.floods import ConnectionFlood, round_trip

NOFILE = 1024  # systemd's default soft limit
HOLD = 1500  # connections held open to each server at once
OFFERED = 1100  # ... of which each server must have been offered this many before the checks


def _raise_own_limit(need: int) -> None:
    """The test's own sockets: up to ``HOLD`` per server."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard == resource.RLIM_INFINITY or hard >= need, \
        f"this test holds {need} sockets; the hard descriptor limit is {hard}"
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def _checkpoints(log: str) -> int:
    return len(re.findall(r"checkpoint at segment \d+ done", log))


def test_a_connection_flood_under_a_low_descriptor_limit_stops_no_server(cluster_factory):
    """Given a secure cluster whose servers may open 1,024 descriptors, checkpointing every
    20 WAL records, and items enqueued before,
    when 1,500 idle TCP connections to each server are held open (those shut replaced) while
    a client connected before does round trips that make the master roll its WAL,
    then every server lives, the round trips all work, the master checkpointed during the
    flood, a new client is served afterwards, and every item enqueued before comes back."""
    _raise_own_limit(3 * HOLD + 1000)
    cluster = cluster_factory(datanodes=2, replication=2, heartbeat_s=0.2, dead_after_s=3.0,
                              nofile=NOFILE, master_args=["--checkpoint-records", "20"])
    with open(f"/proc/{cluster.master.popen.pid}/limits") as f:
        assert re.search(rf"Max open files\s+{NOFILE}\s+{NOFILE}", f.read())
    servers = [cluster.master, *cluster.nodes]
    with Client(cluster.master_addr, timeout_s=10) as client:
        kept = {client.enqueue("keep", f"kept-{i}".encode()): f"kept-{i}".encode()
                for i in range(30)}
        round_trip(client, "rt", 0)  # connected now to the master and both data nodes
        checkpoints_before = _checkpoints(cluster.master.tail(200_000))

        flood = ConnectionFlood([s.addr for s in servers], hold=HOLD, rate_per_s=2000)
        thread = threading.Thread(target=flood.run, args=(30.0,), daemon=True)
        thread.start()
        failures: list[str] = []
        try:
            # until each server was offered more connections than its limit (old servers held
            # them all: ~1,000 descriptors), then round trips: the master rolls its WAL and
            # checkpoints every 20 records
            def offered() -> bool:  # (the flood's figures exist once its thread runs)
                figures = list(flood.figures.values())
                return len(figures) == len(servers) and all(f.made >= OFFERED for f in figures)

            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not offered():
                time.sleep(0.05)
            assert offered(), flood.figures
            for n in range(1, 12):
                try:
                    round_trip(client, "rt", n)
                except Exception as exc:
                    failures.append(f"round trip {n}: {type(exc).__name__}: {exc}")
                    break
        finally:
            flood.stop.set()
            thread.join(30)
        assert [s.name for s in servers if not s.alive] == []
        assert failures == []
        assert _checkpoints(cluster.master.tail(200_000)) > checkpoints_before
        for name, figures in zip((s.name for s in servers), flood.figures.values(), strict=True):
            assert figures.shut >= OFFERED - 200, (name, figures)  # the servers cut most

    with Client(cluster.master_addr, timeout_s=30) as fresh:
        round_trip(fresh, "rt", 99)
        got = fresh.dequeue_many("keep", len(kept) + 1, wait_s=5)
        assert {m.id: m.data for m in got} == kept
        fresh.ack_many(got)
    assert all(s.alive for s in servers)
