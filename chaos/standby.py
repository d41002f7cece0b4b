"""The master's faults when a standby may take over: which master is primary now, and bringing
the one that stopped back as the standby of the one that took over.

After a kill, a pause or a cut of the primary, the standby promotes itself if it was in sync
(``master/ha/standby.py``); an old primary that wakes up or is reconnected learns of the new
epoch and exits ("fenced", status 75). ``recover`` waits for either outcome and restarts the
stopped master as the standby; if no standby took over (it was not in sync), the old
primary is restarted on its log, as without a standby.
"""

from __future__ import annotations

import logging
import signal
import time

from blizzard.local.harness import LocalCluster, Proc
from master.ha.wal_shipping import EXIT_FENCED

log = logging.getLogger(__name__)

TAKE_OVER_S = 12.0  # a standby that has not taken over by then will not (it was not in sync)
EXPECTED_EXITS = (-signal.SIGKILL, EXIT_FENCED)  # killed by the nemesis, or fenced


class MasterFaults:
    """The primary and the standby of a cluster run with ``standby=True``."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster

    def primary(self) -> Proc:
        """The master to fault: the primary now (the first one if neither answers)."""
        self.cluster.find_primary()
        assert self.cluster.master is not None
        return self.cluster.master

    def recover(self, timeout_s: float = 60.0) -> None:
        """Resume both masters and wait until one is primary and the other follows it,
        restarting a stopped one as the standby (or as the primary, if nobody took over)."""
        c = self.cluster
        started = time.monotonic()
        while True:
            for proc in (c.master, c.second):
                if proc is not None:
                    proc.signal(signal.SIGCONT)
            primary = c.find_primary()
            assert c.master is not None and c.second is not None
            if primary is not None and not c.second.alive:
                log.info("%s stopped; it comes back as the standby of %s", c.second.name,
                         c.master.name)
                c.restart_standby()
            elif primary is not None and self._follows(c.second):
                return
            elif primary is None and not c.master.alive and \
                    time.monotonic() - started > TAKE_OVER_S:
                log.warning("the standby did not take over; restarting %s on its log",
                            c.master.name)
                c.restart_master(timeout_s)
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"no primary with a standby following it after {timeout_s}s")
            time.sleep(0.2)

    def _follows(self, proc: Proc) -> bool:
        """``proc`` answers as a standby."""
        welcome = self.cluster.welcome(proc)
        return welcome is not None and bool(welcome.primary)


def primary_host(cluster: LocalCluster) -> str:
    """The host (the process's name: ``master`` or ``standby``) of the primary now."""
    cluster.find_primary()
    assert cluster.master is not None
    return cluster.master.name
