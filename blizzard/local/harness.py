"""Start a real local cluster (master + data nodes as processes) and stop it cleanly.

Used by ``blizzard cluster``, the integration tests, the demo, the benchmark and chaos runs,
so there is one way to run Blizzard's processes. Only loopback addresses are used, unless a
``placement`` puts each process on a host of its own (``chaos.hosts``: network namespaces).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import random
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import zmq

from blizzard.local.procs import Placement, Proc
from blizzard.net import keys as k
from blizzard.net.defaults import LOOPBACK
from blizzard.net.secure import connect_curve
from blizzard.net.transport import Endpoint, call
from blizzard.server import ready_file
from blizzard.wire import protocol as p

__all__ = ["AUTO_KEYS", "LOOPBACK", "LocalCluster", "Placement", "Proc", "StartFailed",
           "free_port", "process_keys"]

AUTO_KEYS = "auto"


def process_keys() -> str:
    """The key directory this process's clusters and clients share: ``BLIZZARD_KEYS`` if set,
    else one made now in a fresh temporary directory and put in ``BLIZZARD_KEYS`` so clients
    here and in child processes find it. That directory holds secret keys: it is removed when
    this process exits."""
    directory = os.environ.get(k.ENV)
    if not directory:
        made = tempfile.mkdtemp(prefix="blizzard-keys-")
        atexit.register(shutil.rmtree, made, True)
        directory = os.path.join(made, "keys")
        os.environ[k.ENV] = directory
    k.generate(directory)
    return directory


def free_port() -> int:
    """A loopback port free right now, picked below the kernel's ephemeral range.

    Ports the kernel hands out on its own (outgoing connections, Spark's JVM binding port 0)
    come from the ephemeral range; choosing elsewhere keeps them from taking ours before our
    server binds it.
    """
    for _ in range(200):
        port = random.randrange(20_000, 32_000)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


class StartFailed(RuntimeError):
    """Raised when a local cluster cannot start: a port it was given is taken, or a process
    exited while starting. ``reason`` is one line for a person; the message adds the log."""

    def __init__(self, reason: str, log: str = "") -> None:
        super().__init__(f"{reason}:\n{log}" if log else reason)
        self.reason = reason


def check_port_free(port: int, what: str) -> None:
    """Raise ``StartFailed`` if ``port`` on the loopback address is taken right now.

    With ``SO_REUSEADDR``, as ZeroMQ binds: connections of a cluster stopped a moment ago,
    still in TIME_WAIT, do not count, a socket listening there does.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOOPBACK, port))
        except OSError as exc:
            raise StartFailed(f"{what} port {port} on {LOOPBACK} is taken ({exc.strerror}): is "
                              "another cluster running there? Stop it or choose other ports") \
                from exc


def primary_argv(argv: list[str]) -> list[str]:
    """A master's command line without ``--standby-of``: it starts as the primary."""
    argv = list(argv)
    if "--standby-of" in argv:
        del argv[argv.index("--standby-of"):argv.index("--standby-of") + 2]
    return argv


@dataclass
class LocalCluster:
    """A master and ``datanodes`` data nodes under ``base_dir`` on free loopback ports."""

    base_dir: str
    datanodes: int = 3
    replication: int = 2
    min_replicas: int | None = None
    heartbeat_s: float = 1.0
    dead_after_s: float = 5.0
    master_args: Sequence[str] = ()
    node_args: Sequence[str] = ()  # more options for every data node
    # data node i -> environment variables set for it alone (a fault a test or bench injects
    # in one node, such as ``BLIZZARD_FAULT_WRITE_DELAY_S``: see datanode/store.py)
    node_env: dict[int, dict[str, str]] = field(default_factory=dict)
    master_port: int | None = None  # None: a free port
    node_base_port: int | None = None  # data node i listens on base + i; None: free ports
    python: str = sys.executable
    keys: str | None = AUTO_KEYS  # a key directory (made if missing); None: --insecure;
    # AUTO_KEYS: ``process_keys()``
    metrics: bool = False  # every process serves Prometheus metrics on a free loopback port
    metrics_ports: dict[str, int] = field(default_factory=dict)  # process name -> port
    log_format: str = "text"  # every process's log format (text or json)
    placement: Callable[[str], Placement] = lambda _name: Placement()  # process name -> where
    # it runs (``chaos.hosts.Hosts.placement``); the default: here, on loopback
    master: Proc | None = None
    nodes: list[Proc] = field(default_factory=list)
    standby: bool = False  # also a hot standby master (``--standby-of`` the master)
    standby_args: Sequence[str] = ()
    second: Proc | None = None  # the standby's process
    nofile: int | None = None  # run every server under this descriptor limit (soft = hard,
    # with ``prlimit``), as a host with a low limit would; None: this process's limits

    def _limit(self) -> list[str]:
        return [] if self.nofile is None else ["prlimit", f"--nofile={self.nofile}", "--"]

    def _security(self) -> list[str]:
        if self.keys is None:
            return ["--insecure"]
        if self.keys == AUTO_KEYS:
            self.keys = process_keys()
        else:
            k.generate(self.keys)
        return ["--keys", self.keys]

    def node_key(self, i: int) -> str:
        """Data node ``i``'s own key's name (``datanode-NAME`` in the key directory): one per
        node and cluster, as clusters of one process share a key directory."""
        digest = hashlib.sha1(os.path.abspath(self.base_dir).encode()).hexdigest()[:8]
        return f"{k.NODE_PREFIX}node{i}-{digest}"

    def _node_key(self, i: int) -> list[str]:
        """``--node-key`` of data node ``i``, its pair made if missing."""
        if self.keys is None:
            return []
        name = self.node_key(i)[len(k.NODE_PREFIX):]
        if name not in k.node_names(self.keys):
            k.add_node(self.keys, name)
        return ["--node-key", name]

    def _metrics(self, name: str) -> list[str]:
        if not self.metrics:
            return []
        self.metrics_ports[name] = free_port()
        return ["--metrics-port", str(self.metrics_ports[name])]

    def metrics_url(self, name: str = "master") -> str:
        """Where process ``name`` (``master``, ``datanode0``, ...) serves its metrics."""
        return f"http://{LOOPBACK}:{self.metrics_ports[name]}/metrics"

    @property
    def master_addr(self) -> str:
        assert self.master is not None
        return self.master.addr

    @property
    def masters(self) -> str:
        """Every master's address, comma-separated (what clients and data nodes are given)."""
        return ",".join(m.addr for m in (self.master, self.second) if m is not None)

    def start(self, timeout_s: float = 30.0) -> LocalCluster:
        """Start every process and wait until the cluster serves.

        A free port can be taken by another program between our probe and the server's bind;
        when ports were picked freely, such a start is retried on new ports.
        """
        os.makedirs(self.base_dir, exist_ok=True)
        self._check_given_ports()
        attempts = 1 if self.master_port or self.node_base_port else 3
        for attempt in range(attempts):
            host = self.placement("master").host
            self.master = self._master_proc(f"tcp://{host}:{self.master_port or free_port()}")
            ready_file.remove(self._data_dir("master"))  # a killed run's says nothing of this one
            self.master.start()
            self.nodes = []
            try:
                # The master first: a data node must never reach a master that is not ours
                # (another one on a port ours failed to bind), or it joins that cluster.
                self._wait_own_master(timeout_s)
                if self.standby:
                    self.second = self._master_proc(
                        f"tcp://{self.placement('standby').host}:{free_port()}", "standby",
                        ["--standby-of", self.master_addr, *self.standby_args]).start()
                for i in range(self.datanodes):
                    port = self.node_base_port + i if self.node_base_port else free_port()
                    host = self.placement(f"datanode{i}").host
                    self.nodes.append(self._node_proc(i, f"tcp://{host}:{port}").start())
                self.wait_ready(timeout_s)
                return self
            except RuntimeError as exc:  # a process exited while starting
                self.stop()
                if attempt == attempts - 1 or "Address already in use" not in str(exc):
                    raise
        return self

    def _wait_own_master(self, timeout_s: float) -> None:
        """Poll until the master started here serves: its ready file says so (with its cluster
        id), and the master that answers on its address has that cluster id. An answer alone
        may come from another master on that port (ours failed to bind and is about to exit)."""
        assert self.master is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._raise_if_exited()
            ours = ready_file.read(self._data_dir("master"))
            if ours is not None:
                answering = self.wait_ready(max(0.1, deadline - time.monotonic()), nodes=0)
                if answering.cluster_id != ours["cluster_id"]:
                    raise StartFailed(f"another master (cluster {answering.cluster_id}) answers "
                                      f"on {self.master_addr}, not ours ({ours['cluster_id']})")
                return
            time.sleep(0.05)
        raise TimeoutError(f"the master wrote no ready file after {timeout_s}s; its "
                           f"log:\n{self.master.tail()}")

    def _data_dir(self, name: str) -> str:
        """Where process ``name`` (``master``, ``standby``, ``datanode0``, ...) keeps its data."""
        return os.path.join(self.base_dir, name)

    def _check_given_ports(self) -> None:
        """Refuse to start on ports that are taken (``StartFailed``), before any process runs."""
        if self.master_port:
            check_port_free(self.master_port, "the master's")
        if self.node_base_port:
            for i in range(self.datanodes):
                check_port_free(self.node_base_port + i, f"data node {i}'s")

    def _master_proc(self, addr: str, name: str = "master", extra: Sequence[str] = ()) -> Proc:
        argv = [*self.placement(name).prefix, *self._limit(), self.python, "-m", "master",
                "--data-dir", self._data_dir(name),
                "--bind", addr, "--replication", str(self.replication),
                "--heartbeat-s", str(self.heartbeat_s), "--dead-after-s", str(self.dead_after_s),
                *self._security(), *self._metrics("master"), "--log-format", self.log_format,
                "--log-level", "info",  # what it did as it started, for a test or a person
                *self.master_args, *extra]
        if self.min_replicas is not None:
            argv += ["--min-replicas", str(self.min_replicas)]
        return Proc(name, argv, os.path.join(self.base_dir, f"{name}.log"), addr)

    def _node_proc(self, i: int, addr: str) -> Proc:
        argv = [*self.placement(f"datanode{i}").prefix, *self._limit(), self.python, "-m",
                "datanode",
                "--data-dir", self._data_dir(f"datanode{i}"), "--bind", addr,
                "--master", self.masters, "--heartbeat-s", str(self.heartbeat_s),
                *self._security(), *self._node_key(i), *self._metrics(f"datanode{i}"),
                "--log-format", self.log_format, *self.node_args]
        return Proc(f"datanode{i}", argv, os.path.join(self.base_dir, f"datanode{i}.log"), addr,
                    env=self.node_env.get(i))

    def restart_master(self, timeout_s: float = 30.0) -> None:
        """Start the master again on the same address and data dir (after a kill or stop)."""
        assert self.master is not None
        if self.master.alive:  # a second one would answer nothing, and this one would leak
            raise RuntimeError("restart_master: the master is still running; kill or stop it first")
        self.master = Proc(self.master.name, primary_argv(self.master.argv), self.master.log_path,
                           self.master.addr).start()
        self.wait_ready(timeout_s)

    def follow_new_primary(self) -> None:
        """After the standby took over from the killed master, start that master again as the
        new primary's standby (it starts over from the new primary's checkpoint)."""
        assert self.master is not None and self.second is not None and not self.master.alive
        self.master, self.second = self.second, self.master
        self.restart_standby()

    def restart_standby(self) -> None:
        """Start the standby again (it died, or stopped as a fenced old primary), following
        the master that is primary now."""
        assert self.master is not None and self.second is not None and not self.second.alive
        old = self.second
        self.second = Proc(old.name, [*primary_argv(old.argv), "--standby-of", self.master.addr],
                           old.log_path, old.addr).start()

    def restart_node(self, i: int, *, wipe: bool = False) -> None:
        old = self.nodes[i]
        if wipe:
            shutil.rmtree(self._data_dir(f"datanode{i}"), ignore_errors=True)
        self.nodes[i] = Proc(old.name, old.argv, old.log_path, old.addr, env=old.env).start()

    def status(self, timeout_s: float = 2.0) -> p.ClusterStatus:
        """The primary's ``Status`` (with a standby, whichever of the two is primary now)."""
        if self.second is not None:
            self.find_primary(timeout_s)
        ep = self.endpoint(self.master_addr, "admin")
        try:
            return call(ep, p.Status(), timeout_s)
        finally:
            ep.close()

    def find_primary(self, timeout_s: float = 1.0) -> Proc | None:
        """Which master is the primary now (a running one that follows nobody, of the highest
        epoch); ``master`` and ``second`` swap if the standby took over. None: neither says so."""
        found: list[tuple[int, int, Proc]] = []
        for rank, proc in enumerate(m for m in (self.master, self.second) if m is not None):
            welcome = self.welcome(proc, timeout_s)
            if welcome is not None and not welcome.primary:
                found.append((welcome.epoch, -rank, proc))
        if not found:
            return None
        primary = max(found, key=lambda f: f[:2])[2]
        if primary is self.second:
            self.master, self.second = self.second, self.master
        return primary

    def welcome(self, proc: Proc, timeout_s: float = 1.0) -> p.Welcome | None:
        """A master's answer to ``Hello`` (its epoch, the primary it follows if a standby);
        None if it is not running or does not answer (paused, cut off, starting)."""
        if not proc.alive:
            return None
        ep = self.endpoint(proc.addr)
        try:
            return call(ep, p.Hello(), timeout_s)
        except Exception:
            return None
        finally:
            ep.close()

    def client_keys(self, name: str = "client") -> k.ClientKeys | None:
        """The keys a client of this cluster uses (None when it runs insecure); ``datanode``:
        data node 0's own key (the shared datanode pair is the nodes' server key only)."""
        if self.keys is None:
            return None
        self._security()
        assert self.keys is not None
        return k.ClientKeys.from_dir(self.keys, self.node_key(0) if name == "datanode" else name)

    def endpoint(self, addr: str, name: str = "client") -> Endpoint:
        """An ``Endpoint`` to one of this cluster's servers, with key ``name`` if secure."""
        mine = self.client_keys(name)
        server = None if mine is None else \
            mine.master if addr in self.masters.split(",") else mine.datanode
        return Endpoint(zmq.Context.instance(), addr, mine, server)

    def dealer(self, addr: str, name: str = "client") -> zmq.Socket[bytes]:
        """A bare DEALER socket connected to one of this cluster's servers (for raw frames),
        with key ``name`` if secure."""
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        mine = self.client_keys(name)
        if mine is not None:
            server = mine.master if addr in self.masters.split(",") else mine.datanode
            assert server is not None
            connect_curve(sock, mine, server)
        sock.connect(addr)
        return sock

    def wait_ready(self, timeout_s: float = 30.0, nodes: int | None = None) -> p.ClusterStatus:
        """Poll until the master answers and ``nodes`` data nodes (default: all running) are
        alive."""
        want = nodes if nodes is not None else sum(1 for n in self.nodes if n.alive)
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            self._raise_if_exited()
            try:
                st = self.status(timeout_s=1.0)
                if sum(1 for n in st.nodes if n.alive) >= want:
                    return st
            except Exception as exc:  # not up yet
                last = exc
            time.sleep(0.05)
        raise TimeoutError(f"cluster not ready after {timeout_s}s ({last}); master log:\n"
                           f"{self.master.tail() if self.master else ''}")

    def _raise_if_exited(self) -> None:
        """``StartFailed`` with the last line of its log if a process exited on its own."""
        for proc in [self.master, *self.nodes]:
            if proc is not None and proc.popen is not None and proc.popen.poll() is not None \
                    and proc.popen.returncode not in (0, -9, -15):
                log = proc.tail()
                last = ([line for line in log.splitlines() if line.strip()] or ["no log"])[-1]
                raise StartFailed(f"{proc.name} exited with {proc.popen.returncode}: "
                                  f"{last.strip().removeprefix('Error: ')[:300]}", log)

    def stop(self) -> None:
        for proc in [*self.nodes, self.master, self.second]:
            if proc is not None:
                proc.stop()

    def logs(self) -> str:
        return "\n".join(f"===== {proc.name} =====\n{proc.tail()}"
                         for proc in [self.master, self.second, *self.nodes] if proc is not None)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
