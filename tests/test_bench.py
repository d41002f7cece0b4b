"""The benchmark runs end to end (a smoke run, not a measurement) and says where CPU went."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.cluster
def test_a_quick_bench_prints_every_measurement_with_cpu_per_part():
    proc = subprocess.run([sys.executable, "-m", "bench.throughput", "--quick", "--sizes", "256",
                           "--batches", "50", "--window", "2"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [x["op"] for x in lines] == ["enqueue", "dequeue_ack", "pipeline", "pipeline_window2"]
    for line in lines:
        assert line["n"] == 500 and not line["capped"] and line["ops_per_s"] > 0
    for line in lines[2:]:
        cpu = line["cpu_us_per_item"]
        assert set(cpu) == {"master", "datanodes", "producer", "consumer"}
        assert all(v >= 0 for v in cpu.values())  # servers' clocks tick in 10 ms steps
        assert cpu["producer"] > 0 and cpu["consumer"] > 0
        assert 0 < line["machine_busy"] <= 1


def test_security_and_metrics_settings_combine_into_one_cluster_each(tmp_path):
    from bench.common import clusters_for, metrics_of, security_of

    clusters = clusters_for(str(tmp_path), "both", "both", datanodes=2, replication=2)
    assert [(security_of(c), metrics_of(c)) for c in clusters] == \
        [("on", "on"), ("on", "off"), ("off", "on"), ("off", "off")]
    assert len({c.base_dir for c in clusters}) == 4
    assert [metrics_of(c) for c in clusters_for(str(tmp_path), "on")] == ["off"]


@pytest.mark.cluster
def test_the_shard_rate_bench_counts_what_the_masters_did():
    """``scripts/bench-pei --rate-only`` end to end at a toy size: every cluster's medians
    carry CPU per item and the masters' counted work, which a real run must show."""
    proc = subprocess.run([sys.executable, "-m", "bench.pei", "--rate-only", "--n", "400",
                           "--repeat", "1", "--rate-batches", "100"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    medians = {x["cluster"]: x for x in lines if x["op"] == "shard_rate_median"}
    assert set(medians) == {"one master", "4 shards", "4 shards, one used"}
    for line in medians.values():
        work = line["masters_per_100_items"]
        # 400 items in calls of 100: at least one Enqueue and one Lease request each, and a
        # group commit for each enqueue (an ack riding on a lease is logged too)
        assert work["enqueue_requests"] >= 1 and work["ack_requests"] >= 1
        assert work["enqueue_fsyncs"] > 0 and work["ack_fsyncs"] > 0
        assert work["enqueue_wakeups"] > 0 and line["cpu_us_per_item"]["ack_masters"] > 0


@pytest.mark.cluster  # a script in a process of its own
@pytest.mark.parametrize("unsafe", ["1", ""])
def test_the_no_sync_bound_unsyncs_only_the_processes_it_is_asked_for(unsafe):
    """``--no-sync`` (an estimate, never a way to run Blizzard) puts ``bench/no_sync_site`` on the
    servers' path: with its variable set, fsyncs and LevelDB's synced writes are no-ops; without
    it, nothing changes, so a stray path entry cannot weaken a real server."""
    from bench.common import NO_SYNC_SITE

    probe = ("import os, plyvel, tempfile\n"
             "db = plyvel.DB(tempfile.mkdtemp(), create_if_missing=True)\n"
             "with db.write_batch(sync=True) as wb:\n"
             "    wb.put(b'k', b'v')\n"
             "print(os.fdatasync.__name__, type(db).__name__, db.get(b'k').decode())\n")
    env = {**os.environ, "PYTHONPATH": NO_SYNC_SITE, "BLIZZARD_BENCH_NO_SYNC": unsafe}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    expected = "_no_sync UnsyncedDB v" if unsafe else "fdatasync DB v"
    assert out.stdout.split() == expected.split()


@pytest.mark.cluster
def test_the_workers_bench_measures_its_bounds_and_tags_them():
    """``scripts/bench --workers 1,1 --no-read --ride --no-sync`` end to end at a toy length:
    items flow, consumers read no payload (no Gets
    sent), all three servers said in their logs that they skip their syncs, and the line
    says which bounds it ran. Without bounds, no server says so."""
    def bench(*bounds: str) -> dict:
        proc = subprocess.run([sys.executable, "-m", "bench.workers", "--workers", "1,1",
                               "--seconds", "1", "--security", "off", *bounds],
                              capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.splitlines()[-1])

    line = bench("--no-read", "--ride", "--no-sync")
    assert line["bound"] == ["no-read", "ride", "no-sync"] and line["unsynced_servers"] == 3
    assert line["acked_per_s"] > 0 and line["gets"] == 0 and not line["errors"]
    plain = bench()
    assert "bound" not in plain and plain["unsynced_servers"] == 0 and plain["gets"] > 0


@pytest.mark.cluster
def test_the_calls_bench_gives_each_processs_cpu_per_call_main_thread_and_all():
    """``scripts/bench --calls`` at a toy length: a line per op, with CPU per call of every
    process's main thread, at most its threads' total, and the queue drained by the calls."""
    proc = subprocess.run([sys.executable, "-m", "bench.calls", "--calls", "50"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [x["op"] for x in lines] == ["enqueue", "dequeue_ack"]
    for line in lines:
        main, every = line["cpu_us_main_thread"], line["cpu_us_all_threads"]
        assert set(main) == {"client", "master", "datanode0", "datanode1"}
        assert set(every) == {"master", "datanode0", "datanode1"}
        assert main["client"] > 0 and main["master"] > 0 and line["wall_us"] > 0
        assert all(0 <= main[name] <= every[name] for name in every)
    assert "the queue ran dry" not in proc.stderr


@pytest.mark.cluster
def test_the_driver_lease_bench_leases_every_item_and_leaves_no_scratch_behind():
    """``scripts/bench --spark --driver-lease`` at a toy length: every item leased, CPU per
    item of this process and the servers, and its scratch dir removed."""
    before = {n for n in os.listdir("/tmp") if n.startswith("blizzard-bench-spark-")}
    proc = subprocess.run([sys.executable, "-m", "bench.spark", "--spark", "--driver-lease",
                           "3000", "--security", "off"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [json.loads(text) for text in proc.stdout.splitlines()]
    assert line["op"] == "driver_lease" and line["items"] == 3000 and line["calls"] == 1
    assert line["client_cpu_us_per_item"] > 0 and set(line["cpu_us_per_item"]) == {
        "master", "datanodes"}
    after = {n for n in os.listdir("/tmp") if n.startswith("blizzard-bench-spark-")}
    assert after <= before


def test_the_master_loop_puts_every_item_through_the_master_in_process():
    """``scripts/bench --master-loop`` at a toy length: every item placed, enqueued (committed
    on its two reports), leased (ordered pushed), acked; the master's CPU per item."""
    from bench import master_loop

    line = master_loop.run(300)  # raises if an item is left unacked or a lease unanswered
    assert line["items"] == 300 and line["master_cpu_us_per_item"] > 0


def test_the_peers_table_gives_each_blizzard_line_its_ratio_to_each_peer():
    from bench import peers
    blizzard = [{"replication": 2, "min_replicas": 2, "acked_per_s": 900,
                 "cpu_us_per_acked_item": {"servers": 1000.0, "master": 500.0}},
                {"replication": 3, "min_replicas": 2, "acked_per_s": 600,
                 "cpu_us_per_acked_item": {"servers": 1400.0, "master": 650.0}}]
    measured = [{"system": "rabbitmq-quorum", "acked_per_s": 400,
                 "server_cpu_us_per_acked_item": {"total": 1300.0}},
                {"system": "nats-jetstream-r3", "acked_per_s": 0, "errors": ["no start"]}]
    ratios = peers.ratios(blizzard, measured)["blizzard_over"]
    assert ratios == [{"replication": 2, "min_replicas": 2, "rabbitmq-quorum": 2.25,
                       "nats-jetstream-r3": None},
                      {"replication": 3, "min_replicas": 2, "rabbitmq-quorum": 1.5,
                       "nats-jetstream-r3": None}]
    table = peers.table(blizzard, measured).splitlines()
    assert table[0].endswith("| Blizzard R=2 W=2 / it | Blizzard R=3 W=2 / it |")
    assert "| rabbitmq-quorum | 400 | 1,300 | 2.25x | 1.50x |" in table
    assert "| nats-jetstream-r3 | 0 | - | - | - |" in table


def test_the_workers_bench_refuses_unknown_peers_and_impossible_replication():
    from bench.workers import peer_names, replica_configs
    assert peer_names("redis-wait, beanstalkd-f0") == ["redis-wait", "beanstalkd-f0"]
    assert replica_configs("2,3/2") == [(2, None), (3, 2)]
    for bad in ("3/4", "0", "x", "3/x"):
        with pytest.raises(Exception, match="want"):
            replica_configs(bad)
    with pytest.raises(Exception, match="unknown peer kafka; known: redis-always"):
        peer_names("kafka")
