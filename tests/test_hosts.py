"""Hosts in network namespaces (``chaos.hosts``), with real processes: a cluster whose
master, data nodes and clients each have a host and an address of their own, a data node cut
off from the master, and a short ``chaos run --hosts``.

These need root (CI runs as root). Without it they fail, saying so: they must not pass by
being skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from blizzard.local.harness import LocalCluster
from blizzard.wire.protocol import NodeStatus
from chaos import netns
from chaos.hosts import Hosts, host_names

from support.wait import wait_for

pytestmark = [pytest.mark.root, pytest.mark.cluster]

CLI = [sys.executable, "-c", "from blizzard.cli.main import main; main()"]


def blizzard_on(hosts: Hosts, host: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a ``blizzard`` command on ``host``."""
    proc = subprocess.run([*hosts.prefix(host), *CLI, *args], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, f"blizzard {' '.join(args)} on {host}: {proc.stderr}"
    return proc


def node_alive(cluster: LocalCluster, addr: str) -> bool:
    return next(n.alive for n in cluster.status().nodes if n.addr == addr)


def _holding(cluster: LocalCluster, items: int) -> list[NodeStatus] | None:
    """The data nodes, once their heartbeats report ``items`` items in all."""
    nodes = cluster.status().nodes
    return nodes if sum(n.items for n in nodes) == items else None


def ours(run_id: str) -> list[str]:
    """The namespaces and links of hosts runs whose id starts with ``run_id`` that exist now."""
    return [name for name in [*netns.namespaces(), *netns.links()]
            if name.startswith((f"bz-{run_id}", f"bz{run_id}"))]


def test_a_data_node_cut_off_from_the_master_still_serves_what_it_holds(tmp_path):
    # Given a master, two data nodes (R=1: every item on exactly one) and two clients,
    # each on a host of its own
    with Hosts(list(host_names(datanodes=2, clients=2))) as hosts:
        run_id = hosts.run_id
        assert len(ours(run_id)) == 2 * 5 + 1  # a namespace and a veth per host, one bridge
        with LocalCluster(str(tmp_path / "cluster"), datanodes=2, replication=1,
                          heartbeat_s=0.2, dead_after_s=1.5,
                          placement=hosts.placement) as cluster:
            assert cluster.master_addr.startswith(f"tcp://{hosts.addr('master')}:")
            # When client0 enqueues 30 items
            sent = {f"item-{i}" for i in range(30)}
            blizzard_on(hosts, "client0", "enqueue", "q", *sorted(sent),
                        "--master", cluster.master_addr)
            # and the data node holding most of them is cut off from the master (not from
            # the clients)
            nodes = wait_for(lambda: _holding(cluster, len(sent)), 10, "heartbeats with items")
            cut = max(nodes, key=lambda n: n.items).addr
            held = max(n.items for n in nodes)
            host = next(h for h in ("datanode0", "datanode1") if f"//{hosts.addr(h)}:" in cut)
            hosts.cut(host, "master")
            wait_for(lambda: not node_alive(cluster, cut), 10, "the master declaring it dead")
            # Then client1 reads every item, those only the cut node holds too
            out = blizzard_on(hosts, "client1", "dequeue", "q", "--ack", "--json", "--n", "30",
                              "--master", cluster.master_addr)
            got = {item["data"] for item in json.loads(out.stdout)["items"]}
            assert got == sent
            assert not node_alive(cluster, cut)
            # and enqueues meanwhile are confirmed, none with a copy on the node declared dead
            blizzard_on(hosts, "client0", "enqueue", "q", *[f"late-{i}" for i in range(10)],
                        "--master", cluster.master_addr)
            # and once healed, the master sees the node again, holding no more than it held
            hosts.heal()
            wait_for(lambda: node_alive(cluster, cut), 15, "the cut node alive again")
            # (it may have deleted some since: the items read were acked)
            assert next(n.items for n in cluster.status().nodes if n.addr == cut) <= held
    # and nothing of the run is left behind
    assert ours(run_id) == []
    assert hosts.leftovers() == []


def test_a_host_cut_off_from_everyone_is_unreachable_until_it_rejoins(tmp_path):
    with Hosts(["master", "datanode0", "client0"]) as hosts:
        with LocalCluster(str(tmp_path / "cluster"), datanodes=1, replication=1,
                          heartbeat_s=0.2, dead_after_s=1.0,
                          placement=hosts.placement) as cluster:
            hosts.isolate("datanode0")
            wait_for(lambda: not node_alive(cluster, cluster.nodes[0].addr), 10,
                     "an isolated data node declared dead")
            hosts.isolate("master")
            failed = subprocess.run([*hosts.prefix("client0"), *CLI, "queue", "list",
                                     "--master", cluster.master_addr],
                                    capture_output=True, text=True, timeout=30,
                                    env={**os.environ, "BLIZZARD_TIMEOUT_S": "1"})
            assert failed.returncode != 0
            hosts.heal()
            cluster.wait_ready(15)
            blizzard_on(hosts, "client0", "queue", "list", "--master", cluster.master_addr)
    assert hosts.leftovers() == []


def test_a_short_chaos_run_on_hosts_with_partitions_and_a_standby_passes(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "chaos", "run", "--hosts", "--standby", "--seed", "3",
           "--duration-s", "30",
           "--datanodes", "4", "--node-kills", "0", "--node-wipes", "0", "--node-pauses", "0",
           "--master-pauses", "0", "--master-kills", "1", "--consumer-stalls", "1",
           "--run-dir", str(run_dir), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the run stops its cluster and removes its hosts
        out, err = proc.communicate()
    if proc.returncode != 0:
        print(out, err[-5000:])
        for log in sorted([*(run_dir / "cluster").glob("*.log"), *run_dir.glob("client*.log")]):
            print(f"===== {log.name}\n{log.read_text(errors='replace')[-3000:]}")
    assert proc.returncode == 0
    figures = json.loads((run_dir / "report.json").read_text())
    checker = figures["checker"]
    assert figures["valid"]
    assert (checker["lost"], checker["unexpected"], checker["payload_mismatches"],
            checker["ids_reused"]) == (0, 0, 0, 0)
    assert checker["acknowledged"] > 1000
    assert {p["kind"] for p in figures["partitions"]} == {"cut_node", "cut_client", "flap_link",
                                                           "cut_master"}
    # the standby took over from the killed primary and from the one cut off
    failovers = figures["master_faults"]
    assert [f["kind"] for f in failovers] == ["kill_master", "cut_master"]
    assert all(f["first_ack_after_s"] is not None for f in failovers)
    summary = (run_dir / "summary.txt").read_text()
    assert "master faults (first enqueue acknowledged after" in summary
    assert "partitions: " in summary
    processes = {op["process"] for op in map(json.loads, open(run_dir / "history.jsonl"))}
    assert {"producer-0", "producer-1", "consumer-0", "consumer-1", "nemesis"} <= processes
    assert ours(f"{proc.pid:x}z") == []  # the run removed its namespaces, veths and bridge
