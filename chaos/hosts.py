"""Hosts in network namespaces: each process of a cluster on its own private address.

``Hosts(["master", "datanode0", ..., "client0"])`` makes, for one run, a Linux bridge in this
namespace and, per host, a network namespace joined to the bridge by a veth pair, on a /24
of 10.77.0.0/16 that no link here uses yet (host i is ``.i+1``, the bridge ``.254``, so this
process -- the harness, its monitor and nemesis -- reaches every host). Servers bind their
host's address and start with ``ip netns exec NS`` (``placement``, for ``LocalCluster``).

Partitions are made without netem or packet filters: ``isolate`` takes a host's bridge
port down (cut off from everyone, this process included), ``cut`` adds blackhole routes for
each other's address in two namespaces (exactly that pair), ``heal`` undoes every one.

Names carry the owner's pid (``bz-<pid hex>z<k>-<host>`` for namespaces, ``bz<pid hex>z<k>-<n>``
for links), so runs never collide, and ``clean_stale`` removes what runs whose process is
gone left behind. Leaving the context always removes the run's namespaces, veths and bridge,
after killing anything still running inside its namespaces.
"""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import re
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from blizzard.local.harness import Placement
from chaos import netns

log = logging.getLogger(__name__)

PREFIX = "bz"
NETWORK = "10.77"  # runs take a free /24 of it: 10.77.N.0/24
BRIDGE_HOST = 254
LOCK_PATH = "/tmp/blizzard-hosts.lock"  # serialises picking a subnet and creating the bridge
_RUNS = itertools.count()
_OWNER = re.compile(rf"^{PREFIX}-?([0-9a-f]+z[0-9a-z])-")  # the run id in our names


@dataclass(frozen=True)
class Host:
    """One host: its namespace, the bridge end of its veth, and its address."""

    name: str
    netns: str
    port: str  # the veth end on the bridge; down = cut off
    addr: str


class Hosts:
    """The hosts of one run; a context manager that always removes what it made."""

    def __init__(self, names: Sequence[str]) -> None:
        if len(set(names)) != len(names) or not 0 < len(names) < BRIDGE_HOST:
            raise ValueError(f"host names must be distinct, 1-{BRIDGE_HOST - 1}: {names}")
        self.names = list(names)
        self.run_id = f"{os.getpid():x}z{_base36(next(_RUNS) % 36)}"
        self.bridge = f"{PREFIX}{self.run_id}-br"
        self.subnet = ""  # 10.77.N, picked at start
        self.hosts: dict[str, Host] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Hosts:
        netns.require_root()
        clean_stale()
        try:
            with _locked():
                self.subnet = _free_subnet()
                netns.add_bridge(self.bridge, f"{self.subnet}.{BRIDGE_HOST}/24")
            for n, name in enumerate(self.names):
                host = Host(name, f"{PREFIX}-{self.run_id}-{name}", f"{PREFIX}{self.run_id}-{n}",
                            f"{self.subnet}.{n + 1}")
                netns.add_namespace(host.netns)
                self.hosts[name] = host
                netns.add_veth(host.port, f"{PREFIX}{self.run_id}p{n}", self.bridge, host.netns,
                               f"{host.addr}/24")
        except BaseException:
            self.close()
            raise
        log.info("hosts up on %s.0/24 (bridge %s): %s", self.subnet, self.bridge,
                 ", ".join(f"{h.name} {h.addr}" for h in self.hosts.values()))
        return self

    def close(self) -> None:
        """Kill what still runs in the run's namespaces, then remove veths, bridge, namespaces."""
        _remove(self.run_id)
        left = self.leftovers()
        if left:
            log.error("hosts run %s left behind: %s", self.run_id, left)

    def leftovers(self) -> list[str]:
        """Namespaces and links of this run that still exist (none after ``close``)."""
        return [name for name in [*netns.namespaces(), *netns.links()]
                if _run_of(name) == self.run_id]

    def __enter__(self) -> Hosts:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- where processes run -----------------------------------------------------------------

    def addr(self, name: str) -> str:
        return self.hosts[name].addr

    def prefix(self, name: str) -> tuple[str, ...]:
        """The command prefix that runs a program on host ``name``."""
        return ("ip", "netns", "exec", self.hosts[name].netns)

    def placement(self, name: str) -> Placement:
        """Where ``LocalCluster`` runs its process ``name`` (``master``, ``datanode0``, ...)."""
        return Placement(self.prefix(name), self.addr(name))

    # -- partitions --------------------------------------------------------------------------

    def isolate(self, name: str) -> None:
        """Cut host ``name`` off from every other host (its bridge port goes down)."""
        netns.set_link(self.hosts[name].port, up=False)

    def rejoin(self, name: str) -> None:
        netns.set_link(self.hosts[name].port, up=True)

    def cut(self, a: str, b: str) -> None:
        """Cut exactly the pair ``a``-``b``: each drops what it sends to the other."""
        netns.blackhole(self.hosts[a].netns, self.addr(b))
        netns.blackhole(self.hosts[b].netns, self.addr(a))

    def mend(self, a: str, b: str) -> None:
        netns.unblackhole(self.hosts[a].netns, self.addr(b))
        netns.unblackhole(self.hosts[b].netns, self.addr(a))

    def heal(self) -> None:
        """Every port up and every cut mended, whatever is in effect."""
        for host in self.hosts.values():
            netns.set_link(host.port, up=True)
            netns.flush_blackholes(host.netns)


def clean_stale() -> list[str]:
    """Remove the namespaces and links of hosts runs whose owning process is gone; their names."""
    stale = {run for run in map(_run_of, [*netns.namespaces(), *netns.links()])
             if run is not None and not _alive(int(run.split("z")[0], 16))}
    removed = []
    for run in sorted(stale):
        log.warning("removing hosts run %s left behind by a process that is gone", run)
        removed += _remove(run)
    return removed


def _remove(run_id: str) -> list[str]:
    """Kill processes in the run's namespaces, delete its links (veths, bridge) and namespaces."""
    spaces = [ns for ns in netns.namespaces() if _run_of(ns) == run_id]
    for ns in spaces:
        for pid in netns.namespace_pids(ns):
            _kill(pid)
    removed = []
    for link in sorted(netns.links(), key=lambda name: name.endswith("-br")):  # bridge last
        if _run_of(link) == run_id:
            removed.append(link)
            _quietly(netns.delete_link, link)
    for ns in spaces:
        removed.append(ns)
        _quietly(netns.delete_namespace, ns)
    return removed


def _run_of(name: str) -> str | None:
    """The run id in a namespace or link name of ours, else None."""
    m = _OWNER.match(name)
    return m.group(1) if m else None


def _free_subnet() -> str:
    """``10.77.N`` for the lowest N no address of this namespace is in."""
    used = {a.split(".")[2] for a in netns.root_addresses() if a.startswith(NETWORK + ".")}
    for n in range(256):
        if str(n) not in used:
            return f"{NETWORK}.{n}"
    raise netns.IpError(f"every /24 of {NETWORK}.0.0/16 is in use")


class _locked:
    """An exclusive lock on ``LOCK_PATH`` for the block (two runs starting at once)."""

    def __enter__(self) -> None:
        self._fd = os.open(LOCK_PATH, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill(pid: int) -> None:
    """SIGKILL a process left in one of the run's namespaces (the harness started it)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _quietly(fn: Callable[[str], None], name: str) -> None:
    """Remove ``name``; one that is already gone (a veth whose peer went first) is fine."""
    try:
        fn(name)
    except netns.IpError as exc:
        log.debug("%s", exc)


def _base36(n: int) -> str:
    return "0123456789abcdefghijklmnopqrstuvwxyz"[n]


def host_names(datanodes: int, clients: int, masters: Sequence[str] = ("master",)) -> Iterator[str]:
    """The usual host names: the master(s), ``datanode0..``, ``client0..``."""
    yield from masters
    yield from (f"datanode{i}" for i in range(datanodes))
    yield from (f"client{i}" for i in range(clients))
