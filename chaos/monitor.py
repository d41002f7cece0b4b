"""The monitor: samples the cluster's status for the timeline and notices processes that die.

A sample is ``{"time", "under_replicated", "alive", "ready", "leased"}`` (``None``
figures while the master does not answer). A server process that exits other than by the
nemesis' ``kill -9`` (or, at the end, other than cleanly on SIGTERM) is recorded in the
history as a ``crash``.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from typing import Any

from blizzard.local.harness import LocalCluster
from chaos.history import INFO, History
from chaos.standby import EXPECTED_EXITS

log = logging.getLogger(__name__)


class Monitor(threading.Thread):
    """Polls ``status`` every ``interval_s`` until stopped."""

    def __init__(self, cluster: LocalCluster, history: History, queue: str,
                 interval_s: float = 0.25) -> None:
        super().__init__(name="monitor", daemon=True)
        self.cluster, self.history, self.queue = cluster, history, queue
        self.interval_s = interval_s
        self.samples: list[dict[str, Any]] = []
        self.stopping = threading.Event()
        self._reported: set[int] = set()  # pids whose exit was already recorded

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)

    def run(self) -> None:
        while not self.stopping.wait(self.interval_s):
            self.sample()
            self.check_processes()

    def sample(self) -> None:
        row: dict[str, Any] = {"time": round(self.history.now(), 3), "under_replicated": None,
                               "alive": None, "ready": None, "leased": None}
        try:
            st = self.cluster.status(timeout_s=1.0)
        except Exception:  # the master is down or paused: a gap in the plot
            self.samples.append(row)
            return
        row["under_replicated"] = st.under_replicated
        row["alive"] = sum(1 for n in st.nodes if n.alive)
        for q in st.queues:
            if q.queue == self.queue:
                row["ready"], row["leased"] = q.ready, q.leased
        self.samples.append(row)

    def check_processes(self, *, stopped: bool = False) -> None:
        """Record processes that exited on their own. While running, only the nemesis' ``kill
        -9`` is expected; after ``cluster.stop()`` (``stopped``), only a clean exit (0)."""
        expected = (0,) if stopped else (-signal.SIGKILL,)
        if self.cluster.standby and not stopped:
            expected = EXPECTED_EXITS  # an old primary that learnt of a newer epoch: fenced
        procs = self.cluster.processes() if hasattr(self.cluster, "processes") else \
            [self.cluster.master, self.cluster.second, *self.cluster.nodes]  # sharded: all shards'
        for proc in procs:
            if proc is None or proc.popen is None:
                continue
            code = proc.popen.poll()
            if code is None or code in expected or proc.popen.pid in self._reported:
                continue
            self._reported.add(proc.popen.pid)
            log.error("%s exited with status %s on its own", proc.name, code)
            self.history.record("monitor", INFO, "crash",
                                {"process": proc.name, "status": code, "log": proc.tail(1500)})

    def write(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            for row in self.samples:
                f.write(json.dumps(row) + "\n")
