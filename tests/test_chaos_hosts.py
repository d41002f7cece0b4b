"""``chaos --hosts`` without processes: partition faults in the schedule and the CLI, the
workload's share per client host, merged histories, the stale-run cleaner and its refusal
without root. The real runs are in ``tests/test_hosts.py``."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest
from click.testing import CliRunner

from chaos import history, netns, report
from chaos import hosts as hosts_module
from chaos.checker import check
from chaos.cli import cli
from chaos.client_host import SLOT, SharedProgress
from chaos.client_hosts import ClientHosts
from chaos.schedule import (
    CUT_CLIENT,
    CUT_MASTER,
    CUT_NODE,
    FLAP_LINK,
    FaultPlan,
    Timing,
    make_schedule,
)
from chaos.workload import WorkloadConfig

PARTITIONED = FaultPlan(node_kills=1, node_wipes=0, master_kills=1, node_pauses=0,
                        master_pauses=0, node_cuts=2, client_cuts=2, link_flaps=1)


@pytest.mark.parametrize("seed", range(10))
def test_partitions_join_the_cluster_lane_with_their_targets(seed):
    t = Timing()
    faults = make_schedule(seed, 60, datanodes=5, consumers=2, plan=PARTITIONED, timing=t,
                           clients=3)
    kinds = [f.kind for f in faults]
    assert (kinds.count(CUT_NODE), kinds.count(CUT_CLIENT), kinds.count(FLAP_LINK)) == (2, 2, 1)
    cluster = [f for f in faults if f.lane == "cluster"]
    assert len(cluster) == 7
    for a, b in pairwise(cluster):
        assert a.at_s + a.duration_s <= b.at_s, f"cluster faults overlap: {a} {b}"
    for f in faults:
        if f.kind == CUT_NODE:
            assert 0 <= f.target < 5 and f.duration_s > t.dead_after_s  # declared dead
        if f.kind == CUT_CLIENT:
            assert 0 <= f.target < 3 and f.duration_s > t.lease_s  # its leases run out
            assert f.describe().split()[2] == f"client{f.target}"


def test_partitions_need_hosts_and_a_master_cut_needs_a_standby():
    with pytest.raises(ValueError, match="--hosts"):
        make_schedule(1, 60, datanodes=5, consumers=2, plan=PARTITIONED)
    cut_master = FaultPlan(master_cuts=1)
    with pytest.raises(ValueError, match="standby"):
        make_schedule(1, 60, datanodes=5, consumers=2, plan=cut_master, clients=2)
    faults = make_schedule(1, 60, datanodes=5, consumers=2, plan=cut_master, clients=2,
                           standby=True)
    assert [f.target for f in faults if f.kind == CUT_MASTER] == [None]


def test_a_plan_without_partitions_gives_the_schedule_it_gave_before_hosts():
    plain = make_schedule(5, 60, datanodes=5, consumers=2)
    assert plain == make_schedule(5, 60, datanodes=5, consumers=2, clients=2)
    assert FaultPlan(node_cuts=2, link_flaps=1).scaled(2.0).counts()[FLAP_LINK] == 2


def test_the_cli_asks_for_hosts_before_partitions():
    runner = CliRunner()
    without = runner.invoke(cli, ["schedule", "--seed", "1", "--node-cuts", "1"])
    assert without.exit_code == 2 and "--node-cuts needs --hosts" in without.output
    no_standby = runner.invoke(cli, ["schedule", "--seed", "1", "--hosts", "--master-cuts", "1"])
    assert no_standby.exit_code == 2 and "standby" in no_standby.output
    shown = runner.invoke(cli, ["schedule", "--seed", "1", "--hosts"])
    assert shown.exit_code == 0
    assert {"cut_node", "cut_client", "flap_link"} <= {line.split()[1] for line in
                                                      shown.output.splitlines()}


def test_each_client_host_runs_its_share_of_the_workers(tmp_path):
    with history.History(str(tmp_path / "h.jsonl")) as hist:
        hosts = ClientHosts(lambda name: ("on", name), 2, "tcp://10.77.0.1:5555", hist,
                            WorkloadConfig(producers=3, consumers=2), 7, str(tmp_path))
    specs = [json.loads(h.argv[-1]) for h in hosts.hosts]
    assert [s["names"] for s in specs] == [["producer-0", "producer-2", "consumer-0",
                                            "consumer-dead"], ["producer-1", "consumer-1"]]
    assert hosts.hosts[1].argv[:2] == ["on", "client1"]
    assert all(s["t0"] == hist.t0 and s["hosts"] == 2 for s in specs)
    assert [c.host.name for c in hosts.consumers] == ["client0", "client1"]


def test_client_hosts_share_the_backlog_and_never_share_a_sequence_number(tmp_path):
    path = str(tmp_path / "progress.bin")
    (tmp_path / "progress.bin").write_bytes(bytes(SLOT.size * 2))
    a, b = SharedProgress(path, 0, 2), SharedProgress(path, 1, 2)
    seqs_a, seqs_b = a.take(5), b.take(5)
    assert not set(seqs_a) & set(seqs_b) and seqs_b == [1, 3, 5, 7, 9]
    a.enqueued(5)
    b.enqueued(5)
    a.dequeued(seqs_b[:3])  # host 0 consumes what host 1 produced
    assert a.backlog == b.backlog == 7


def test_histories_of_the_hosts_merge_in_time_order(tmp_path):
    paths = [str(tmp_path / f"{name}.jsonl") for name in ("run", "client0")]
    for path, times in zip(paths, [(0.1, 0.5), (0.2, 0.3, 0.9)], strict=True):
        with open(path, "w") as f:
            for t in times:
                f.write(json.dumps({"index": 0, "time": t, "process": path[-10:]}) + "\n")
    history.merge(paths, paths[0])
    ops = list(history.read(paths[0]))
    assert [op["time"] for op in ops] == [0.1, 0.2, 0.3, 0.5, 0.9]
    assert [op["index"] for op in ops] == [0, 1, 2, 3, 4]


def test_the_report_lists_the_partitions(tmp_path):
    ops = [{"index": 0, "time": 1.0, "process": "nemesis", "type": "ok", "f": "cut_node",
            "value": {"fault": 0, "target": 2}},
           {"index": 1, "time": 4.5, "process": "nemesis", "type": "ok", "f": "heal",
            "value": {"fault": 0, "kind": "cut_node"}}]
    tl = report.timeline(ops)
    options = dict(seed=1, duration_s=60.0, datanodes=5, replication=3, heartbeat_s=0.2,
                   dead_after_s=1.5, lease_s=2.0, hosts=True, clients=2)
    figures = report.figures(check(ops), {"run_dir": str(tmp_path), "runtime_s": 1.0,
                                          "options": options}, tl)
    assert figures["partitions"] == [{"kind": "cut_node", "target": 2, "start_s": 1.0,
                                      "end_s": 4.5}]
    text = report.summary(figures)
    assert "partitions: cut_node datanode2 1-4.5s" in text and "2 client hosts" in text


def test_hosts_need_root(monkeypatch):
    monkeypatch.setattr(hosts_module.os, "geteuid", lambda: 1000)
    with pytest.raises(netns.NamespacesUnavailable, match="must run as root"):
        hosts_module.Hosts(["master"]).start()


def test_the_stale_cleaner_removes_only_runs_whose_owner_is_gone(monkeypatch):
    gone, alive = 0x7ffffe, 0x10
    names = [f"bz-{gone:x}z0-master", f"bz{gone:x}z0-0", f"bz{gone:x}z0-br",
             f"bz-{alive:x}z1-master", f"bz{alive:x}z1-0", "eth0", "bz-unrelated"]
    deleted: list[str] = []
    monkeypatch.setattr(netns, "namespaces", lambda: [n for n in names if n.startswith("bz-")])
    monkeypatch.setattr(netns, "links", lambda: [n for n in names if not n.startswith("bz-")])
    monkeypatch.setattr(netns, "namespace_pids", lambda ns: [])
    monkeypatch.setattr(netns, "delete_link", deleted.append)
    monkeypatch.setattr(netns, "delete_namespace", deleted.append)
    monkeypatch.setattr(hosts_module, "_alive", lambda pid: pid == alive)
    hosts_module.clean_stale()
    assert deleted == [f"bz{gone:x}z0-0", f"bz{gone:x}z0-br", f"bz-{gone:x}z0-master"]
