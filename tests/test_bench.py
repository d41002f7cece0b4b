"""The benchmark runs end to end (a smoke run, not a measurement) and says where CPU went."""

from __future__ import annotations

import json
import subprocess
import sys


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
