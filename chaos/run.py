"""One chaos run: start a cluster, run the workload under faults, heal, drain, check, report."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from blizzard import Client
from blizzard.local.harness import LocalCluster
from blizzard.local.shard_cluster import ShardedCluster
from chaos import checker, history, report
from chaos import jobs as jobs_lane
from chaos.client_hosts import ClientHosts
from chaos.history import OK, History
from chaos.hosts import Hosts, host_names
from chaos.monitor import Monitor
from chaos.nemesis import Nemesis
from chaos.partitions import Partitions
from chaos.schedule import Fault, FaultPlan, Timing, make_schedule, to_json
from chaos.shards import ChaosShards
from chaos.standby import primary_host
from chaos.workload import Workload, WorkloadConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """Everything a run is told; ``seed`` fixes the schedule and the payloads."""

    seed: int
    run_dir: str
    duration_s: float = 60.0  # workload time with faults; healing and draining come after
    datanodes: int = 5
    replication: int = 3
    heartbeat_s: float = 0.2
    dead_after_s: float = 1.5
    pending_timeout_s: float = 5.0
    checkpoint_records: int = 500  # low, so master restarts recover from checkpoints too
    plan: FaultPlan = field(default_factory=FaultPlan)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    drain_timeout_s: float = 60.0
    keep_data: bool = False  # keep the nodes' LevelDBs and the master's WAL after a pass
    hosts: bool = False  # every process on a host of its own (network namespaces, root only)
    clients: int = 2  # client hosts, with hosts
    standby: bool = False  # a hot standby master runs: only then may the plan cut the master off
    masters: int = 1  # shards (``chaos/shards.py``), each with ``datanodes`` data nodes
    max_stall_s: float | None = None  # fail if a data-node fault stalls clients longer

    def schedule(self) -> list[Fault]:
        return make_schedule(self.seed, self.duration_s, datanodes=self.datanodes * self.masters,
                             consumers=self.workload.consumers, plan=self.plan,
                             timing=Timing(dead_after_s=self.dead_after_s,
                                           lease_s=self.workload.lease_s),
                             clients=self.clients if self.hosts else 0, standby=self.standby)

    def describe(self) -> dict[str, Any]:
        d = asdict(self)
        d["lease_s"] = self.workload.lease_s
        return d


@dataclass
class RunResult:
    """The verdict and where the evidence is."""

    result: checker.CheckResult
    run_dir: str
    summary: str
    stalled: list[dict[str, Any]] = field(default_factory=list)  # over ``max_stall_s``
    jobs_valid: bool = True  # the jobs lane's verdict (chaos/jobs.py)

    @property
    def passed(self) -> bool:
        return self.result.valid and not self.stalled and self.jobs_valid


def run(opts: RunOptions) -> RunResult:
    """Carry out a whole run; the cluster is always stopped, whatever happens."""
    started = time.monotonic()
    os.makedirs(opts.run_dir, exist_ok=True)
    schedule = opts.schedule()
    with open(os.path.join(opts.run_dir, "schedule.json"), "w", encoding="utf-8") as f:
        json.dump(to_json(schedule), f, indent=1)
    history_path = os.path.join(opts.run_dir, "history.jsonl")
    with contextlib.ExitStack() as stack:  # hosts are removed last, after every process stopped
        masters = ("master", "standby") if opts.standby else ("master",)
        hosts = stack.enter_context(Hosts(list(host_names(opts.datanodes, opts.clients,
                                                          masters)))) if opts.hosts else None
        master_args = ["--pending-timeout-s", str(opts.pending_timeout_s),
                       "--checkpoint-records", str(opts.checkpoint_records),
                       "--keep-wal"]  # the jobs lane reads the whole WAL (chaos/jobs.py)
        cluster: Any = LocalCluster(
            os.path.join(opts.run_dir, "cluster"), datanodes=opts.datanodes,
            replication=opts.replication, heartbeat_s=opts.heartbeat_s,
            dead_after_s=opts.dead_after_s, standby=opts.standby, master_args=master_args,
            **({"placement": hosts.placement} if hosts else {})) if opts.masters == 1 else \
            ChaosShards(ShardedCluster(
                os.path.join(opts.run_dir, "cluster"), masters=opts.masters,
                datanodes=opts.datanodes, replication=opts.replication,
                heartbeat_s=opts.heartbeat_s, dead_after_s=opts.dead_after_s,
                master_args=master_args))
        stack.callback(cluster.stop)
        log.info("run dir %s: seed %d, %d faults planned, cluster starting", opts.run_dir,
                 opts.seed, len(schedule))
        cluster.start()
        # schedules and dependencies under the same faults (chaos/jobs.py); one master's
        # WAL is read after, so not with shards, nor from a host of its own
        lane = jobs_lane.JobsLane(cluster.masters, opts.workload.timeout_s) \
            if opts.masters == 1 and hosts is None else None
        with History(history_path) as hist:
            monitor = Monitor(cluster, hist, opts.workload.queue)
            parts = _exercise(cluster, hist, monitor, schedule, opts, hosts, lane)
            cluster.stop()
            monitor.check_processes(stopped=True)
        jobs = lane.check([os.path.join(cluster.base_dir, name, "wal")
                           for name in ("master", "standby")]) if lane is not None else None
    if parts:
        history.merge([history_path, *parts], history_path)
    monitor.write(os.path.join(opts.run_dir, "samples.jsonl"))

    result = checker.check(history.read(history_path))
    tl = report.timeline(history.read(history_path))
    meta = {"run_dir": opts.run_dir, "runtime_s": round(time.monotonic() - started, 2),
            "options": opts.describe(), "faults_planned": len(schedule)}
    figures = report.figures(result, meta, tl, max_stall_s=opts.max_stall_s)
    if jobs is not None:
        jobs_lane.write(opts.run_dir, jobs)
        figures["jobs"] = jobs
        figures["valid"] = figures["valid"] and jobs["valid"]
    try:
        report.plot(tl, monitor.samples, os.path.join(opts.run_dir, "timeline.png"),
                    f"seed {opts.seed}: {'PASS' if figures['valid'] else 'FAIL'}",
                    max_stall_s=opts.max_stall_s)
    except ImportError as exc:  # the report and summary matter more than the picture
        log.warning("no timeline.png: %s (install the chaos extra: .venv/bin/pip install -e "
                    "'.[chaos]')", exc)
    text = report.write(opts.run_dir, figures)
    if figures["valid"] and not opts.keep_data:
        cluster.remove_data() if isinstance(cluster, ChaosShards) else _remove_data(cluster)
    return RunResult(result, opts.run_dir, text, figures["liveness_failed"],
                     jobs_valid=jobs is None or jobs["valid"])


def _exercise(cluster: LocalCluster, hist: History, monitor: Monitor, schedule: list[Fault],
              opts: RunOptions, hosts: Hosts | None,
              lane: jobs_lane.JobsLane | None = None) -> list[str]:
    """The timed part: workload and faults, then heal and drain. Returns the histories the
    client hosts wrote, if any (to merge with the run's)."""
    workload: Workload | ClientHosts
    if hosts is None:
        workload = Workload(cluster.masters, hist, opts.workload, opts.seed)
        nemesis = Nemesis(cluster, hist, schedule, workload)
    else:
        workload = ClientHosts(hosts.prefix, opts.clients, cluster.masters, hist,
                               opts.workload, opts.seed, opts.run_dir)
        nemesis = Nemesis(cluster, hist, schedule, workload,
                          partitions=Partitions(hosts, opts.seed, lambda: primary_host(cluster),
                                                masters=("master", "standby") if opts.standby
                                                else ("master",)))
    workload.start()
    if lane is not None:
        lane.start()
    monitor.start()
    nemesis.start()
    try:
        time.sleep(max(0.0, opts.duration_s - hist.now()))
        log.info("workload time is up: stopping producers, healing the cluster")
        workload.stop_producers()
        nemesis.stop_and_heal()
        if lane is not None:
            lane.finish(opts.drain_timeout_s)
        _drain(cluster, hist, workload, opts)
    finally:
        if lane is not None:
            lane.stop_producing.set()
            lane.stop_consuming.set()
        nemesis.stopping.set()
        workload.stop_producers()
        workload.stop_consumers()
        monitor.stop()
    return workload.history_paths if isinstance(workload, ClientHosts) else []


def _drain(cluster: LocalCluster, hist: History, workload: Workload | ClientHosts,
           opts: RunOptions) -> None:
    """Let the consumers empty the queue and its dead letters, stop them, and record what is
    left in every queue of the run (``chaos``, ``chaos.dead``, ...)."""
    workload.drain()
    deadline = time.monotonic() + opts.drain_timeout_s
    with Client(cluster.masters, timeout_s=opts.workload.timeout_s) as client:
        empty_polls = 0
        while empty_polls < 3 and time.monotonic() < deadline:
            time.sleep(0.5)
            empty_polls = 0 if _waiting(client, opts.workload.queue) else empty_polls + 1
        workload.stop_consumers()
        hist.invoke("drain", "drain")
        left = _waiting(client, opts.workload.queue)
        total = {k: sum(q[k] for q in left.values()) for k in ("ready", "delayed", "leased")}
        hist.record("drain", OK, "drain", {**total, "left_in": left,
                                           "under_replicated": client.status().under_replicated})
    log.info("drained: %s", left or "nothing left")


def _waiting(client: Client, main: str) -> dict[str, dict[str, int]]:
    """Ready, delayed and leased items of each of the run's queues that still holds some."""
    left = {}
    for q in client.queues():
        if q["queue"] == main or q["queue"].startswith(main + "."):
            counts = {k: q[k] for k in ("ready", "delayed", "leased")}
            if any(counts.values()):
                left[q["queue"]] = counts
    return left


def _remove_data(cluster: LocalCluster) -> None:
    """Drop the data directories of a passing run; the logs stay."""
    for name in os.listdir(cluster.base_dir):
        path = os.path.join(cluster.base_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
