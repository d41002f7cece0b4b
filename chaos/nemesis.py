"""The nemesis: carries out the schedule against the cluster's processes, then heals it all.

One thread per lane (see ``chaos.schedule``). Each fault is recorded as ``invoke`` then
``ok`` (in effect) -- or ``info`` if it could not be applied -- and its end as a ``heal``
op with the same ``fault`` number. A fault that is due while the run is stopping is not
started; one in progress is healed at once.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable

from blizzard.local.harness import LocalCluster, Proc
from chaos.client_hosts import ClientHosts
from chaos.history import INFO, OK, History
from chaos.partitions import Partitions
from chaos.schedule import (
    CHURN,
    CUT_MASTER,
    CUT_NODE,
    FLAP_LINK,
    KILL_MASTER,
    KILL_NODE,
    PARTITIONS,
    PAUSE_MASTER,
    PAUSE_NODE,
    STALL_CONSUMER,
    WIPE_NODE,
    Fault,
)
from chaos.shards import ChaosShards
from chaos.standby import MasterFaults
from chaos.workload import Workload

log = logging.getLogger(__name__)

PROCESS = "nemesis"


class Nemesis:
    """Applies faults from a schedule, lane by lane, and heals them."""

    def __init__(self, cluster: LocalCluster | ChaosShards, history: History, schedule: list[Fault],
                 workload: Workload | ClientHosts, *, gate_timeout_s: float = 20.0,
                 partitions: Partitions | None = None) -> None:
        self.cluster, self.history, self.workload = cluster, history, workload
        self.partitions = partitions  # with hosts in network namespaces
        self.masters = MasterFaults(cluster) if cluster.standby else None
        self.gate_timeout_s = gate_timeout_s
        self.stopping = threading.Event()
        self.node_locks = [threading.Lock() for _ in cluster.nodes]
        # Held by each churn fault; a wipe holds it too, so churn pauses while it waits.
        self.churn_lock = threading.Lock()
        lanes: dict[str, list[tuple[int, Fault]]] = {}
        for number, fault in enumerate(schedule):
            lanes.setdefault(fault.lane, []).append((number, fault))
        self.threads = [threading.Thread(target=self._lane, args=(faults,), name=f"nemesis-{lane}",
                                         daemon=True) for lane, faults in lanes.items()]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop_and_heal(self) -> None:
        """Stop starting faults, end those in progress, and bring every process back."""
        self.stopping.set()
        for t in self.threads:
            t.join(120)
        self.heal_all()

    # -- lanes -------------------------------------------------------------------------------

    def _lane(self, faults: list[tuple[int, Fault]]) -> None:
        for number, fault in faults:
            if self.stopping.wait(max(0.0, fault.at_s - self.history.now())):
                return
            try:
                self._apply(number, fault)
            except Exception as exc:  # a nemesis bug must not hide the run's results
                log.exception("fault %d (%s) failed", number, fault.kind)
                self.history.record(PROCESS, INFO, fault.kind, {"fault": number},
                                    f"{type(exc).__name__}: {exc}")

    def _apply(self, number: int, fault: Fault) -> None:
        if fault.kind == CHURN:
            self._churn(number, fault)
        elif fault.kind == WIPE_NODE:
            self._wipe(number, fault)
        elif fault.kind in (KILL_NODE, PAUSE_NODE):
            assert fault.target is not None
            with self.node_locks[fault.target]:
                self._run(number, fault, fault.target, *self._node_actions(fault))
        elif fault.kind in (KILL_MASTER, PAUSE_MASTER):
            self._master_fault(number, fault)
        elif fault.kind == STALL_CONSUMER:
            self._stall(number, fault)
        elif fault.kind in PARTITIONS:
            self._partition(number, fault)
        else:
            raise ValueError(f"unknown fault kind {fault.kind!r}")

    def _master_fault(self, number: int, fault: Fault) -> None:
        """Kill or pause the primary. With a standby, it takes over meanwhile (if in sync), and
        the healing brings the stopped master back as its standby. Sharded: one shard's
        master, the others serving meanwhile."""
        if isinstance(self.cluster, ChaosShards):
            self._shard_master_fault(number, fault)
            return
        target = self._master()

        def apply() -> None:
            target.kill() if fault.kind == KILL_MASTER else target.signal(signal.SIGSTOP)

        def heal() -> None:
            if self.masters is not None:
                self.masters.recover()
            elif fault.kind == KILL_MASTER:
                self.cluster.restart_master()
            else:
                target.signal(signal.SIGCONT)
        self._run(number, fault, None, apply, heal)

    def _shard_master_fault(self, number: int, fault: Fault) -> None:
        cluster = self.cluster
        assert isinstance(cluster, ChaosShards)
        k = cluster.shard_for(number)
        target = cluster.master_of(k)

        def apply() -> None:
            target.kill() if fault.kind == KILL_MASTER else target.signal(signal.SIGSTOP)

        def heal() -> None:
            if fault.kind == KILL_MASTER:
                cluster.restart_master(k)
            else:
                target.signal(signal.SIGCONT)
        self._run(number, fault, k, apply, heal)

    def _node_actions(self, fault: Fault) -> tuple[Callable[[], None], Callable[[], None]]:
        i = fault.target
        assert i is not None
        if fault.kind == PAUSE_NODE:
            return (lambda: self.cluster.nodes[i].signal(signal.SIGSTOP),
                    lambda: self.cluster.nodes[i].signal(signal.SIGCONT))
        return (lambda: self.cluster.nodes[i].kill(),
                lambda: self.cluster.restart_node(i, wipe=fault.kind == WIPE_NODE))

    def _run(self, number: int, fault: Fault, target: int | None, apply: Callable[[], None],
             heal: Callable[[], None], **extra: object) -> None:
        """Apply, hold for the fault's duration (less if stopping), heal; record each step."""
        value = {"fault": number, "target": target, "duration_s": fault.duration_s, **extra}
        self.history.invoke(PROCESS, fault.kind, value)
        apply()
        self.history.record(PROCESS, OK, fault.kind, value)
        log.info("fault %d: %s", number, fault.describe())
        self.stopping.wait(fault.duration_s)
        self.history.invoke(PROCESS, "heal", {"fault": number, "kind": fault.kind})
        try:
            heal()
        except Exception as exc:  # heal_all tries again at the end
            log.exception("healing fault %d (%s) failed", number, fault.kind)
            self.history.record(PROCESS, INFO, "heal", {"fault": number, "kind": fault.kind},
                                f"{type(exc).__name__}: {exc}")
            return
        self.history.record(PROCESS, OK, "heal", {"fault": number, "kind": fault.kind})

    def _partition(self, number: int, fault: Fault) -> None:
        """A partition; one of a data node holds its lock, so churn does not kill it meanwhile."""
        if self.partitions is None:
            raise ValueError(f"{fault.kind} needs hosts in network namespaces")
        actions = self.partitions.actions(number, fault)
        if fault.kind == CUT_MASTER and self.masters is not None:
            masters, (cut, mend) = self.masters, actions  # the cut one comes back as the standby
            actions = cut, lambda: (mend(), masters.recover())
        if fault.kind in (CUT_NODE, FLAP_LINK):
            assert fault.target is not None
            with self.node_locks[fault.target]:
                self._run(number, fault, fault.target, *actions)
        else:
            self._run(number, fault, fault.target, *actions)

    def _churn(self, number: int, fault: Fault) -> None:
        assert fault.target is not None
        n = len(self.cluster.nodes)
        with self.churn_lock:
            # The planned node may be down from the cluster lane: take the next free one.
            for k in range(n):
                i = (fault.target + k) % n
                if self.node_locks[i].acquire(blocking=False):
                    try:
                        self._run(number, fault, i, lambda i=i: self.cluster.nodes[i].kill(),
                                  lambda i=i: self.cluster.restart_node(i), planned=fault.target)
                    finally:
                        self.node_locks[i].release()
                    return
        self._skip(number, fault, "no free data node")

    def _skip(self, number: int, fault: Fault, why: str) -> None:
        value = {"fault": number, "target": fault.target, "duration_s": fault.duration_s}
        self.history.invoke(PROCESS, fault.kind, value)
        self.history.record(PROCESS, INFO, fault.kind, value, f"skipped: {why}")
        log.warning("fault %d (%s) skipped: %s", number, fault.kind, why)

    def _wipe(self, number: int, fault: Fault) -> None:
        """Wipe a node only when every item has R live replicas, so another copy survives (P1)."""
        assert fault.target is not None
        with self.churn_lock, self.node_locks[fault.target]:
            waited = self._wait_fully_replicated()
            if waited is None:
                self._skip(number, fault, f"still under-replicated after {self.gate_timeout_s}s")
                return
            apply, heal = self._node_actions(fault)
            self._run(number, fault, fault.target, apply, heal, gate_s=round(waited, 3))

    def _wait_fully_replicated(self) -> float | None:
        started = time.monotonic()
        while time.monotonic() - started < self.gate_timeout_s and not self.stopping.is_set():
            try:
                st = self.cluster.status(timeout_s=1.0)
                alive = sum(1 for node in st.nodes if node.alive)
                if st.under_replicated == 0 and alive >= st.replication:
                    return time.monotonic() - started
            except Exception:  # the master may be restarting
                pass
            time.sleep(0.1)
        return None

    def _stall(self, number: int, fault: Fault) -> None:
        assert fault.target is not None
        consumer = self.workload.consumers[fault.target]
        value = {"fault": number, "target": fault.target, "duration_s": fault.duration_s}
        self.history.invoke(PROCESS, STALL_CONSUMER, value)
        done = consumer.stall(fault.duration_s)
        self.history.record(PROCESS, OK, STALL_CONSUMER, value)
        self.history.invoke(PROCESS, "heal", {"fault": number, "kind": STALL_CONSUMER})
        # The stall starts with the consumer's next batch; it ends by itself.
        finished = done.wait(fault.duration_s + 30.0)
        self.history.record(PROCESS, OK if finished else INFO, "heal",
                            {"fault": number, "kind": STALL_CONSUMER})

    # -- healing -----------------------------------------------------------------------------

    def _master(self) -> Proc:
        """The master to fault: with a standby, whichever is primary now."""
        if self.masters is not None:
            return self.masters.primary()
        assert self.cluster.master is not None
        return self.cluster.master

    def heal_all(self, timeout_s: float = 60.0) -> None:
        """Restore every link, resume paused processes, restart dead ones (disks kept) and
        wait for all to be up."""
        self.history.invoke(PROCESS, "heal_all")
        if self.partitions is not None:
            self.partitions.heal_all()
        for i, node in enumerate(self.cluster.nodes):
            node.signal(signal.SIGCONT)
            if not node.alive:
                self.cluster.restart_node(i)
        if self.masters is not None:
            self.masters.recover(timeout_s)
        elif isinstance(self.cluster, ChaosShards):
            self.cluster.heal_masters(timeout_s)
        else:
            master = self._master()
            master.signal(signal.SIGCONT)
            if not master.alive:
                self.cluster.restart_master(timeout_s)
        self.cluster.wait_ready(timeout_s, nodes=len(self.cluster.nodes))
        self.history.record(PROCESS, OK, "heal_all")
