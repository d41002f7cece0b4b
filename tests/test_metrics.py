"""Prometheus metrics: the histogram kept in plain Python, and ``/metrics`` of a real cluster
scraped after a known workload (depths, totals, latencies, under-replication after a kill)."""

from __future__ import annotations

import pathlib
import signal
import socket
import subprocess
import sys
import time
import zlib

import pytest
from prometheus_client import generate_latest

from blizzard import Client
from blizzard.local.harness import free_port
from blizzard.net.transport import raise_if_error
from blizzard.server.metrics import LATENCY_BUCKETS_S, Timing, histogram
from blizzard.wire import protocol as p
from datanode.store import LevelDbStore, MemoryStore
from master.config import MasterConfig
from master.log.wal import MemoryWal
from master.server import MasterServer

from support.in_process_master import NoRouter
from support.prometheus import parse, scrape, value
from support.wait import wait_for


def in_process_master(wal: MemoryWal) -> MasterServer:
    """A master over ``wal`` with one data node that has reported (out of safe mode)."""
    server = MasterServer(MasterConfig(data_dir="unused", replication=1), wal=wal,
                          router=NoRouter())
    call(server, p.Heartbeat("dn-a", "tcp://127.0.0.1:1", 0, 0, 10**12), b"dn-a")
    server.tick(time.time(), time.monotonic())
    return server


def call(master: MasterServer, msg, peer: bytes = b"peer"):
    """One request through the handler, made durable, as a pass of the loop does."""
    reply = master.handle(peer, 1, msg, time.time(), time.monotonic())
    master.wal.flush()
    return raise_if_error(reply)


def test_a_timing_is_a_cumulative_histogram_whose_count_is_its_buckets():
    timing = Timing()
    for seconds in (0.000001, 0.003, 0.003, 99.0):
        timing.observe(seconds)
    buckets = dict(timing.cumulative())
    assert buckets[str(LATENCY_BUCKETS_S[0])] == 1
    assert buckets["0.005"] == 3 and buckets["10.0"] == 3 and buckets["+Inf"] == 4
    family = histogram("x_seconds", "help", [(("Put",), timing)], ["op"])
    by_name = {s.name: s.value for s in family.samples if s.labels.get("le") in (None, "+Inf")}
    assert by_name == {"x_seconds_bucket": 4, "x_seconds_count": 4,
                       "x_seconds_sum": timing.sum_s}


def test_totals_count_live_events_and_not_a_replay_of_the_log():
    # Given a master that enqueued 3 items, leased 2, acked one and nacked one
    wal = MemoryWal()
    master = in_process_master(wal)
    placement = call(master, p.Place(3, []))
    call(master, p.PutReport("dn-a", placement.ids, [], ""), b"dn-a")
    call(master, p.Enqueue("q", placement.ids, [10] * 3, [7] * 3, [0] * 3, [0.0] * 3, [""] * 3,
                           False, "r", False, 5.0, None))
    leased = call(master, p.Lease("q", 2, 60.0, 0.0, "l1", [], []))
    call(master, p.Ack(leased.ids[:1], leased.leases[:1], False))
    call(master, p.Nack(leased.ids[1:], leased.leases[1:], None, "no"))
    samples = parse(generate_latest(master.metrics.registry).decode())
    totals = {kind: value(samples, f"blizzard_queue_{kind}_total", queue="q")
              for kind in ("enqueued", "leased", "acked", "nacked")}
    assert totals == {"enqueued": 3, "leased": 2, "acked": 1, "nacked": 1}
    assert value(samples, "blizzard_queue_ready_items", queue="q") == 2
    assert value(samples, "blizzard_master_request_duration_seconds_count", op="Lease") is None
    # (the loop times requests; ``handle`` alone does not)

    # When a second master recovers from the same log
    again = in_process_master(wal)
    samples = parse(generate_latest(again.metrics.registry).decode())
    # Then it has the depths but counted nothing: replayed records are not events
    assert value(samples, "blizzard_queue_ready_items", queue="q") == 2
    assert value(samples, "blizzard_queue_enqueued_total", queue="q") is None
    assert value(samples, "blizzard_master_items") == 2


@pytest.mark.cluster
def test_a_checkpoint_is_timed_from_fork_to_reaped(tmp_path):
    master = MasterServer(MasterConfig(data_dir=str(tmp_path), replication=1,
                                       checkpoint_records=1), router=NoRouter())
    try:
        settings = [None] * (len(p.fields_of(p.Configure)) - 2)
        call(master, p.Configure("q", True, *settings))  # one WAL record
        wait_for(lambda: master.run_once(0) or master.metrics.checkpoints,
                 what="the checkpoint's child to be reaped")
        samples = parse(generate_latest(master.metrics.registry).decode())
        assert value(samples, "blizzard_master_checkpoints_total") == 1
        assert 0 < value(samples, "blizzard_master_checkpoint_duration_seconds") < 10
        assert value(samples, "blizzard_master_wal_fsync_duration_seconds_count") >= 1
    finally:
        master.close()


@pytest.mark.parametrize("kind", ["memory", "leveldb"])
def test_a_store_counts_reads_failing_their_checksum(tmp_path, kind):
    store = MemoryStore() if kind == "memory" else LevelDbStore(str(tmp_path / "db"))
    try:
        blobs = [b"good", b"soon bad"]
        store.put_many([1, 2], blobs, [zlib.crc32(b) for b in blobs])
        store.corrupt_for_test(2)
        assert store.get_many([1, 2])[1] is None
        assert store.get_many([2])[0] is None
        assert store.checksum_failures == 2
    finally:
        store.close()


def test_metrics_of_a_cluster_after_a_known_workload_and_a_node_kill(cluster_factory):
    # Given a cluster serving metrics, two data nodes, R=2
    cluster = cluster_factory(datanodes=2, replication=2, heartbeat_s=0.2, dead_after_s=1.5,
                              metrics=True)
    master = cluster.metrics_url("master")
    with Client(cluster.master_addr, timeout_s=10, admin=True) as c:
        # When: 10 enqueued; 4 leased and acked; one nacked; one lease runs out; one held
        c.enqueue_many("work", [b"x" * 100] * 10)
        for msg in c.dequeue_many("work", 4):
            msg.ack(wait=True)
        c.dequeue("work").nack(error="not now")
        assert c.dequeue("work", lease_s=0.3) is not None
        wait_for(lambda: value(scrape(master), "blizzard_queue_expired_total", queue="work"),
                 what="the lease to expire")
        held = c.dequeue("work", lease_s=300)
        assert held is not None
        # ... and one item dead-lettered after its only allowed attempt
        c.create_queue("poison", max_attempts=1)
        c.enqueue("poison", b"bad")
        c.dequeue("poison").nack(error="boom")

        # Then the master's figures are exactly those
        m = scrape(master)
        assert {q: [value(m, f"blizzard_queue_{kind}_total", queue=q)
                    for kind in ("enqueued", "leased", "acked", "nacked", "expired",
                                 "dead_lettered")]
                for q in ("work", "poison")} == {"work": [10, 7, 4, 1, 1, None],
                                                 "poison": [1, 1, None, 1, None, 1]}
        depths = {q: [value(m, f"blizzard_queue_{kind}_items", queue=q)
                      for kind in ("ready", "delayed", "leased", "pending", "dead")]
                  for q in ("work", "poison", "poison.dead")}
        assert depths == {"work": [5, 0, 1, 0, 0], "poison": [0, 0, 0, 0, 1],
                          "poison.dead": [1, 0, 0, 0, 0]}
        assert value(m, "blizzard_queue_oldest_ready_age_seconds", queue="work") > 0
        assert value(m, "blizzard_queue_oldest_ready_age_seconds", queue="poison") == 0
        assert value(m, "blizzard_master_items") == 7
        assert value(m, "blizzard_master_request_duration_seconds_count", op="Enqueue") >= 2
        assert value(m, "blizzard_master_request_duration_seconds_bucket", op="Lease",
                     le="+Inf") >= 5  # one per dequeue call
        assert value(m, "blizzard_master_wal_fsync_duration_seconds_count") > 0
        wal = pathlib.Path(cluster.base_dir, "master", "wal")
        wait_for(lambda: value(scrape(master), "blizzard_master_wal_written_bytes_total")
                 == sum(f.stat().st_size for f in wal.glob("wal-*.log")),
                 what="the WAL bytes counted to be the WAL's size (no checkpoint yet)")
        assert value(m, "blizzard_safe_mode") == 0
        assert value(m, "blizzard_datanodes", state="alive") == 2
        assert value(m, "blizzard_datanodes", state="suspect") == 0
        assert value(m, "blizzard_datanodes", state="dead") == 0
        assert value(m, "blizzard_write_hedges_total") == 0  # no node was slow
        pushed = value(m, "blizzard_pushed_leases_total", by="node") + \
            value(m, "blizzard_pushed_leases_total", by="master")
        assert pushed <= value(m, "blizzard_master_request_duration_seconds_bucket", op="Lease",
                               le="+Inf")  # at most one order per lease
        assert value(m, "blizzard_master_sync_holds_total") == 0  # one client: never held
        assert value(m, "blizzard_under_replicated_items") == 0
        held.ack(wait=True)

    # ... and each data node's: every item on both (acked blobs deleted on the master's word)
    for name in ("datanode0", "datanode1"):
        url = cluster.metrics_url(name)
        wait_for(lambda url=url: value(scrape(url), "blizzard_datanode_items") == 6,
                 what=f"{name} to hold the 6 items left")
        d = scrape(url)
        assert value(d, "blizzard_datanode_stored_bytes") == 5 * 100 + 3
        assert value(d, "blizzard_datanode_free_disk_bytes") > 0
        assert value(d, "blizzard_datanode_request_duration_seconds_count", op="put") >= 2
        assert value(d, "blizzard_datanode_leveldb_sync_duration_seconds_count") >= 1
        assert value(d, "blizzard_datanode_replication_copies_in_flight") == 0
        assert value(d, "blizzard_datanode_sync_holds_total") == 0
        assert value(d, "blizzard_datanode_checksum_failures_total") == 0
    reads = sum(value(scrape(cluster.metrics_url(n)),
                      "blizzard_datanode_request_duration_seconds_count", op=op)
                for n in ("datanode0", "datanode1") for op in ("get", "push"))
    assert reads >= 5  # each dequeue's payloads came from one of them: read, or pushed

    # When a data node dies, Then its items are counted under-replicated (no third node to copy to)
    cluster.nodes[1].kill()
    wait_for(lambda: value(scrape(master), "blizzard_datanodes", state="dead") == 1,
             what="the master to see the node dead")
    wait_for(lambda: value(scrape(master), "blizzard_under_replicated_items") == 6,
             what="every item under-replicated")
    assert value(scrape(master), "blizzard_datanodes", state="alive") == 1


@pytest.mark.cluster
def test_a_metrics_port_in_use_is_one_clear_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "master", "--data-dir", str(tmp_path / "m"),
                               "--bind", f"tcp://127.0.0.1:{free_port()}", "--insecure",
                               "--metrics-port", str(port)],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert f"Error: cannot serve metrics on 127.0.0.1:{port}: Address already in use" \
        in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.cluster
def test_the_cluster_command_serves_metrics_and_prints_where(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "blizzard.cli", "cluster", "--data-dir",
                             str(tmp_path), "--datanodes", "1", "--replication", "1", "--port",
                             str(free_port()), "--node-port", str(free_port())],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        urls = {}
        while len(urls) < 2:
            line = proc.stdout.readline()
            assert line, "the cluster command ended before printing its metrics URLs"
            if line.startswith("metrics of "):
                name, _, url = line.removeprefix("metrics of ").strip().partition(": ")
                urls[name] = url
        assert sorted(urls) == ["datanode0", "master"]
        assert all(url.startswith("http://127.0.0.1:") for url in urls.values())
        wait_for(lambda: value(scrape(urls["master"]), "blizzard_datanodes", state="alive") == 1,
                 what="the master's metrics to show its data node")
        assert value(scrape(urls["datanode0"]), "blizzard_datanode_items") == 0
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
