"""Partition faults on hosts in network namespaces: how each is applied and healed.

The nemesis asks ``actions(number, fault)`` for an (apply, heal) pair and runs it like any
other fault; ``heal_all`` at the end brings every port up and mends every cut, whatever
happened in between.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

from chaos.hosts import Hosts
from chaos.schedule import CUT_CLIENT, CUT_MASTER, CUT_NODE, FLAP_LINK, Fault

log = logging.getLogger(__name__)

FLAP_S = (0.2, 1.0)  # a flapping link stays down, then up, this long (uniform)

Actions = tuple[Callable[[], None], Callable[[], None]]


class Partitions:
    """Cuts between the hosts of one run (``chaos.hosts.Hosts``)."""

    def __init__(self, hosts: Hosts, seed: int, primary: Callable[[], str] = lambda: "master",
                 masters: tuple[str, ...] = ("master",)) -> None:
        self.hosts, self.seed = hosts, seed
        self.primary = primary  # the host of the master that is primary now
        self.masters = masters  # every master's host
        self._flaps: dict[int, tuple[threading.Event, threading.Thread]] = {}

    def primary_host(self) -> str:
        """The host of the master now serving as primary: ``cut_master`` cuts the one in
        charge, so a failover has to happen."""
        return self.primary()

    def actions(self, number: int, fault: Fault) -> Actions:
        hosts = self.hosts
        if fault.kind == CUT_NODE:  # from every master: a standby would serve it otherwise
            node = f"datanode{fault.target}"
            return lambda: self._masters(hosts.cut, node), lambda: self._masters(hosts.mend, node)
        if fault.kind == CUT_CLIENT:
            client = f"client{fault.target}"
            return lambda: hosts.isolate(client), lambda: hosts.rejoin(client)
        if fault.kind == CUT_MASTER:
            primary = self.primary_host()
            return lambda: hosts.isolate(primary), lambda: hosts.rejoin(primary)
        if fault.kind == FLAP_LINK:
            node = f"datanode{fault.target}"
            return lambda: self._start_flapping(number, node), lambda: self._stop_flapping(number)
        raise ValueError(f"not a partition: {fault.kind!r}")

    def _masters(self, action: Callable[[str, str], None], node: str) -> None:
        for master in self.masters:
            action(node, master)

    def heal_all(self) -> None:
        for number in list(self._flaps):
            self._stop_flapping(number)
        self.hosts.heal()

    def _start_flapping(self, number: int, host: str) -> None:
        stop = threading.Event()
        rng = random.Random(f"{self.seed}/flap/{number}")
        thread = threading.Thread(target=self._flap, args=(host, stop, rng), daemon=True,
                                  name=f"flap-{host}")
        self._flaps[number] = (stop, thread)
        thread.start()

    def _flap(self, host: str, stop: threading.Event, rng: random.Random) -> None:
        """Down, up, down, ... until stopped; the link is left up."""
        flips = 0
        try:
            while True:
                self.hosts.isolate(host)
                flips += 1
                if stop.wait(rng.uniform(*FLAP_S)):
                    break
                self.hosts.rejoin(host)
                if stop.wait(rng.uniform(*FLAP_S)):
                    break
        finally:
            self.hosts.rejoin(host)
            log.info("%s's link flapped %d times", host, flips)

    def _stop_flapping(self, number: int) -> None:
        stop, thread = self._flaps.pop(number)
        stop.set()
        thread.join(30)
