"""The queues a user would pick instead, under ``bench.workers``'s load, in the same run.

``scripts/bench --workers 8,8 --peers redis-wait,redis-always,beanstalkd-f0`` measures
Blizzard as ``bench.workers`` does, then each peer named: its servers started here on free
127.0.0.1 ports in a scratch dir, P producer and C consumer processes, one item of ``--size``
bytes per call, for ``--seconds``, then the servers stopped. Each peer's line has its acked
items/s, its servers' CPU per acked item (``/proc``, all their threads) and ``promise``: what
its producer's call returning means. A last line gives Blizzard's acked/s over each peer's.

The peers (``PEERS``), each with its own durable acknowledgement:

- ``redis-always``: one redis-server, ``appendonly yes``, ``appendfsync always``. Producers
  ``LPUSH``; consumers ``BLMOVE`` to a processing list and ``LREM`` it from there (the reliable
  queue pattern). The push returns after the primary's AOF fsync. One copy.
- ``redis-wait``: a primary and one replica (``--replicaof``), both ``appendfsync always``;
  each ``LPUSH`` is followed by ``WAIT 1 10000``, which returns once the replica has
  acknowledged the write (it fsyncs its AOF in the same event-loop pass): two fsynced copies,
  replicated asynchronously (no quorum, no automatic failover).
- ``beanstalkd-f0``: one beanstalkd with a binlog fsynced on every write (``-f0``); put,
  reserve, delete. One copy.
- ``nats-jetstream-r3``: three nats-servers in one cluster, a file stream of three replicas
  with work-queue retention and one durable pull consumer. ``js.publish`` returns with the
  PubAck, sent once a quorum (2 of 3) has written the entry to its log: to the page cache,
  not fsynced (nats-server 2.9 has no option to sync each write; 2.10 added one). A process
  crash loses nothing acknowledged; an OS crash of two nodes may. Consumers ``fetch(1)`` and
  ``ack_sync`` (the ack waits for the server's reply). Producer and consumer *i* talk to node
  *i* mod 3.
- ``rabbitmq-quorum``: three RabbitMQ nodes joined in one cluster (their own epmd on a private
  loopback port), one quorum queue of three members. ``basic_publish`` on a confirming channel
  returns with the publisher confirm, sent once a majority (2 of 3) has written and
  fdatasync'ed the entry to its Raft log. Consumers take one message at a time
  (``prefetch_count=1``) and ``basic_ack`` it. Producer and consumer *i* talk to node *i* mod 3
  (the others' clients are proxied to the queue's leader, as in production).

The servers come from Debian's packages and the clients from the ``peers`` extra;
``scripts/bench`` installs both when ``--peers`` is given (``scripts/_peers.sh``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from bench.throughput import tree_cpu_s
from blizzard.local.harness import free_port

MP = mp.get_context("spawn")
QUEUE = "w"
START_S = 30.0  # a server that is not serving by then is reported, and the run goes on


@dataclass
class Servers:
    """The processes of one peer's servers, and what its workers need to reach them."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)

    def pids(self) -> dict[str, int]:
        return {f"server{k}": proc.pid for k, proc in enumerate(self.procs)}

    def stop(self) -> None:
        """Each server's process group: SIGTERM, then after 20 s SIGKILL."""
        for proc in self.procs:
            _signal_group(proc, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc, signal.SIGKILL)
            proc.wait(10)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # its own session (``_spawn``): only what it started
    except ProcessLookupError:
        pass


def _spawn(argv: list[str], log: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)


def _until(ready: Any, what: str) -> None:
    deadline = time.monotonic() + START_S
    while True:
        try:
            if ready():
                return
        except OSError:
            pass
        except Exception as exc:  # noqa: BLE001 (a client's error while the server starts)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: {exc}") from None
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start within {START_S:g} s")
        time.sleep(0.05)


def start_redis(base: str, replica: bool) -> Servers:
    import redis
    servers = Servers()
    for k in range(2 if replica else 1):
        port, data = free_port(), os.path.join(base, f"redis{k}")
        os.makedirs(data)
        argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", data,
                "--appendonly", "yes", "--appendfsync", "always", "--save", "",
                "--protected-mode", "no"]
        if k:
            argv += ["--replicaof", "127.0.0.1", str(servers.ports[0])]
        servers.procs.append(_spawn(argv, os.path.join(base, f"redis{k}.log")))
        servers.ports.append(port)
        client = redis.Redis(host="127.0.0.1", port=port)
        _until(client.ping, f"redis-server on port {port}")
        if k:
            _until(lambda c=client: c.info("replication")["master_link_status"] == "up",
                   "the redis replica's link")
    return servers


def start_beanstalkd(base: str) -> Servers:
    import greenstalk
    port, data = free_port(), os.path.join(base, "beanstalkd")
    os.makedirs(data)
    proc = _spawn(["beanstalkd", "-l", "127.0.0.1", "-p", str(port), "-b", data, "-f0"],
                  os.path.join(base, "beanstalkd.log"))
    servers = Servers([proc], [port])

    def ready() -> bool:
        greenstalk.Client(("127.0.0.1", port)).close()
        return True
    _until(ready, f"beanstalkd on port {port}")
    return servers


NATS_CONFIG = """server_name: n{k}
listen: 127.0.0.1:{port}
jetstream {{ store_dir: "{data}" }}
cluster {{ name: pb, listen: 127.0.0.1:{route}, routes: [{routes}] }}
"""


def start_nats(base: str) -> Servers:
    ports, routes = [free_port() for _ in range(3)], [free_port() for _ in range(3)]
    servers = Servers(ports=ports)
    for k in range(3):
        data, conf = os.path.join(base, f"nats{k}"), os.path.join(base, f"nats{k}.conf")
        os.makedirs(data)
        others = ", ".join(f"nats://127.0.0.1:{r}" for j, r in enumerate(routes) if j != k)
        with open(conf, "w") as f:
            f.write(NATS_CONFIG.format(k=k, port=ports[k], data=data, route=routes[k],
                                       routes=others))
        servers.procs.append(_spawn(["nats-server", "-c", conf],
                                    os.path.join(base, f"nats{k}.log")))
    _until(lambda: _nats(ports[0], _make_stream), "a JetStream stream of 3 replicas")
    return servers


def _nats(port: int, body: Any) -> Any:
    """Run ``body(js)`` on a fresh connection to the node on ``port``."""
    import asyncio

    import nats

    async def go() -> Any:
        conn = await nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=2,
                                  allow_reconnect=False)
        try:
            return await body(conn.jetstream(timeout=5))
        finally:
            await conn.close()
    return asyncio.run(go())


async def _make_stream(js: Any) -> bool:
    from nats.js.api import RetentionPolicy, StorageType, StreamConfig
    await js.add_stream(StreamConfig(name="PB", subjects=["pb.w"], num_replicas=3,
                                     retention=RetentionPolicy.WORK_QUEUE,
                                     storage=StorageType.FILE))
    await js.pull_subscribe("pb.w", durable="pbw")  # made once, here, with its defaults
    return True


RABBIT = "/usr/lib/rabbitmq/bin"  # the scripts themselves (sbin's wrappers switch user)


def start_rabbitmq(base: str) -> Servers:
    import pika
    epmd = free_port()
    cookie = os.path.join(base, ".erlang.cookie")
    with open(cookie, "w") as f:
        f.write(os.urandom(16).hex())
    os.chmod(cookie, 0o400)
    plugins = os.path.join(base, "enabled_plugins")
    with open(plugins, "w") as f:
        f.write("[].\n")
    loopback = "-kernel inet_dist_use_interface {127,0,0,1}"
    common = {**os.environ, "HOME": base, "ERL_EPMD_PORT": str(epmd),
              "ERL_EPMD_ADDRESS": "127.0.0.1", "RABBITMQ_ENABLED_PLUGINS_FILE": plugins,
              "RABBITMQ_CTL_ERL_ARGS": f"-start_epmd false {loopback}"}
    servers = Servers()
    servers.procs.append(_spawn(["epmd", "-address", "127.0.0.1", "-port", str(epmd)],
                                os.path.join(base, "epmd.log"), common))
    nodes = []
    for k in range(3):
        data, port = os.path.join(base, f"rmq{k}"), free_port()
        os.makedirs(data)
        conf = os.path.join(data, "rabbitmq.conf")
        with open(conf, "w") as f:
            f.write(f"listeners.tcp.1 = 127.0.0.1:{port}\n")
        node = f"pb{k}@localhost"
        env = {**common, "RABBITMQ_NODENAME": node, "RABBITMQ_NODE_PORT": str(port),
               "RABBITMQ_DIST_PORT": str(free_port()), "RABBITMQ_CONFIG_FILE": conf,
               "RABBITMQ_MNESIA_BASE": os.path.join(data, "mnesia"),
               "RABBITMQ_LOG_BASE": os.path.join(data, "log"),
               "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": f"-start_epmd false {loopback}"}
        servers.procs.append(_spawn([f"{RABBIT}/rabbitmq-server"],
                                    os.path.join(base, f"rmq{k}.log"), env))
        servers.ports.append(port)
        nodes.append(node)
    ctl = [f"{RABBIT}/rabbitmqctl"]

    def run_ctl(*args: str, timeout: float = 60.0) -> None:
        done = subprocess.run([*ctl, *args], env=common, capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {done.stderr.strip()[-300:]}")
    for node in nodes:  # await_startup fails at once while the node is not yet in epmd
        deadline = time.monotonic() + 120
        while True:
            try:
                run_ctl("-n", node, "await_startup", "--timeout", "60", timeout=90)
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
    for node in nodes[1:]:
        run_ctl("-n", node, "stop_app")
        run_ctl("-n", node, "join_cluster", nodes[0])
        run_ctl("-n", node, "start_app")
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", servers.ports[0]))
    try:
        conn.channel().queue_declare(QUEUE, durable=True, arguments={
            "x-queue-type": "quorum", "x-quorum-initial-group-size": 3})
    finally:
        conn.close()
    return servers


@dataclass(frozen=True)
class Peer:
    name: str
    kind: str  # redis | beanstalkd | nats | rabbitmq
    promise: str
    replica: bool = False

    def start(self, base: str) -> Servers:
        if self.kind == "redis":
            return start_redis(base, self.replica)
        if self.kind == "nats":
            return start_nats(base)
        if self.kind == "rabbitmq":
            return start_rabbitmq(base)
        return start_beanstalkd(base)


PEERS = {peer.name: peer for peer in [
    Peer("redis-always", "redis", "LPUSH returns after the AOF fsync (appendfsync always); "
                                  "one copy"),
    Peer("redis-wait", "redis", "LPUSH after the primary's AOF fsync, then WAIT 1 returns "
                                "once the replica acknowledged it (its own AOF fsynced): two "
                                "copies, asynchronous replication", replica=True),
    Peer("beanstalkd-f0", "beanstalkd", "put returns after the binlog's fsync (-f0); one copy"),
    Peer("nats-jetstream-r3", "nats", "the PubAck comes once 2 of 3 replicas wrote the entry "
                                      "to their logs, not fsynced (nats-server 2.9)"),
    Peer("rabbitmq-quorum", "rabbitmq", "the publisher confirm comes once 2 of 3 members "
                                        "wrote and fdatasync'ed the entry to their Raft logs"),
]}


def worker(peer: Peer, role: str, index: int, ports: list[int], size: int, seconds: float,
           barrier: Any, out: Any, limit: int) -> None:
    """One producer (``p``) or consumer (``c``) process: as many calls as fit in ``seconds``
    (at most ``limit``); puts (role, count, error) on ``out``."""
    body = os.urandom(size)
    count, error = 0, ""
    try:
        if peer.kind == "nats":
            count = _nats_loop(role, ports[index % len(ports)], body, seconds, barrier, limit)
        elif peer.kind == "rabbitmq":
            count = _rabbit_loop(role, ports[index % len(ports)], body, seconds, barrier, limit)
        else:
            step = _redis_step(peer, role, ports, body) if peer.kind == "redis" \
                else _beanstalk_step(role, ports[0], body)
            barrier.wait(120)
            deadline = time.monotonic() + seconds
            while count < limit and time.monotonic() < deadline:
                count += step()
    except Exception as exc:  # noqa: BLE001 (reported in the peer's line, not raised)
        error = f"{type(exc).__name__}: {exc}"[:300]
    out.put((role, count, error))


def _redis_step(peer: Peer, role: str, ports: list[int], body: bytes) -> Any:
    import redis
    client = redis.Redis(host="127.0.0.1", port=ports[0])
    work = f"{QUEUE}:{os.getpid()}"  # this consumer's processing list
    if role == "p":
        def push() -> int:
            client.lpush(QUEUE, body)
            if peer.replica and client.wait(1, 10_000) < 1:
                raise RuntimeError("WAIT 1: the replica did not acknowledge within 10 s")
            return 1
        return push

    def take() -> int:
        item = client.blmove(QUEUE, work, 0.5, "RIGHT", "LEFT")
        if item is None:
            return 0
        client.lrem(work, 1, item)
        return 1
    return take


def _beanstalk_step(role: str, port: int, body: bytes) -> Any:
    import greenstalk
    client = greenstalk.Client(("127.0.0.1", port), encoding=None)
    if role == "p":
        def put() -> int:
            client.put(body)
            return 1
        return put

    def take() -> int:
        try:
            job = client.reserve(timeout=1)
        except greenstalk.TimedOutError:
            return 0
        client.delete(job)
        return 1
    return take


def _nats_loop(role: str, port: int, body: bytes, seconds: float, barrier: Any,
               limit: int) -> int:
    """A NATS worker's whole loop, in one event loop (publish, or fetch one and ack_sync)."""
    import asyncio

    import nats

    async def go() -> int:
        conn = await nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=5)
        js = conn.jetstream(timeout=10)
        sub = None if role == "p" else await js.pull_subscribe("pb.w", durable="pbw")
        await asyncio.get_running_loop().run_in_executor(None, barrier.wait, 120)
        count, deadline = 0, time.monotonic() + seconds
        try:
            while count < limit and time.monotonic() < deadline:
                if sub is None:
                    await js.publish("pb.w", body)
                    count += 1
                    continue
                try:
                    msgs = await sub.fetch(1, timeout=0.5)
                except nats.errors.TimeoutError:
                    continue
                for msg in msgs:
                    await msg.ack_sync()
                    count += 1
        finally:
            await conn.close()
        return count
    return asyncio.run(go())


def _rabbit_loop(role: str, port: int, body: bytes, seconds: float, barrier: Any,
                 limit: int) -> int:
    """A RabbitMQ worker's loop: confirmed publishes, or one message at a time acked."""
    import pika
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = conn.channel()
    count = 0
    try:
        if role == "p":
            channel.confirm_delivery()
            persistent = pika.BasicProperties(delivery_mode=2)
            barrier.wait(120)
            deadline = time.monotonic() + seconds
            while count < limit and time.monotonic() < deadline:
                channel.basic_publish("", QUEUE, body, persistent, mandatory=True)
                count += 1
            return count
        channel.basic_qos(prefetch_count=1)
        barrier.wait(120)
        deadline = time.monotonic() + seconds
        for method, _, _ in channel.consume(QUEUE, inactivity_timeout=0.5):
            if method is not None:
                channel.basic_ack(method.delivery_tag)
                count += 1
            if count >= limit or time.monotonic() >= deadline:
                break
        channel.cancel()
        return count
    finally:
        conn.close()


def run(peer: Peer, producers: int, consumers: int, size: int, seconds: float,
        limit: int = 10_000_000) -> dict[str, Any]:
    """One peer's measurement: its line (acked/s, its servers' CPU per acked item)."""
    base = tempfile.mkdtemp(prefix=f"blizzard-bench-peer-{peer.name}-", dir="/tmp")
    line: dict[str, Any] = {"system": peer.name, "op": "workers", "producers": producers,
                            "consumers": consumers, "size": size, "promise": peer.promise}
    servers = Servers()
    try:
        servers = peer.start(base)
        out, barrier = MP.Queue(), MP.Barrier(producers + consumers + 1)
        roles = [("p", k) for k in range(producers)] + [("c", k) for k in range(consumers)]
        procs = [MP.Process(target=worker, args=(peer, role, k, servers.ports, size, seconds,
                                                 barrier, out, limit), daemon=True)
                 for role, k in roles]
        for proc in procs:
            proc.start()
        pids = servers.pids()
        barrier.wait(120)
        t0 = time.monotonic()
        cpu0 = {name: tree_cpu_s(pid) for name, pid in pids.items()}  # with descendants
        counts, errors = {"p": 0, "c": 0}, []
        try:
            for _ in procs:
                role, n, error = out.get(timeout=seconds + 120)
                counts[role] += n
                if error:
                    errors.append(error)
        finally:
            for proc in procs:
                proc.join(10)
                if proc.is_alive():
                    proc.terminate()
        elapsed = time.monotonic() - t0
        acked = max(1, counts["c"])
        cpu = {name: round((tree_cpu_s(pid) - cpu0[name]) * 1e6 / acked, 1)
               for name, pid in pids.items()}
        line.update(enqueued_per_s=round(counts["p"] / elapsed),
                    acked_per_s=round(counts["c"] / elapsed), seconds=round(elapsed, 1),
                    server_cpu_us_per_acked_item={**cpu, "total": round(sum(cpu.values()), 1)},
                    errors=errors[:3])
    except RuntimeError as exc:  # its servers would not start: said, and the run goes on
        line.update(acked_per_s=0, errors=[str(exc)])
    finally:
        servers.stop()
        if not os.environ.get("BLIZZARD_BENCH_KEEP"):
            shutil.rmtree(base, ignore_errors=True)
    return line


def ratios(blizzard: list[dict[str, Any]], peers: list[dict[str, Any]]) -> dict[str, Any]:
    """Each Blizzard line's acked/s over each peer's (None where a peer acked nothing)."""
    return {"system": "ratios", "op": "workers", "blizzard_over": [
        {"replication": b.get("replication"), "min_replicas": b.get("min_replicas"),
         **{p["system"]: round(b["acked_per_s"] / p["acked_per_s"], 2)
            if p.get("acked_per_s") else None for p in peers}} for b in blizzard]}


def table(blizzard: list[dict[str, Any]], peers: list[dict[str, Any]]) -> str:
    """The run as a Markdown table: acked/s, server CPU per acked item, and each Blizzard
    line's ratio to the system of the row."""
    names = [f"Blizzard R={b['replication']} W={b.get('min_replicas') or b['replication']}"
             for b in blizzard]
    rows = ["| system | acked/s | server CPU µs per acked item | "
            + " | ".join(f"{n} / it" for n in names) + " |",
            "|---|---|---|" + "---|" * len(names)]
    for b, name in zip(blizzard, names, strict=True):
        cpu = b["cpu_us_per_acked_item"]
        rows.append(f"| {name} | {b['acked_per_s']:,} | {cpu['servers']:,.0f} (master "
                    f"{cpu['master']:,.0f}) |" + " |" * len(names))
    for p in peers:
        cpu = (p.get("server_cpu_us_per_acked_item") or {}).get("total")
        cells = [f"{b['acked_per_s'] / p['acked_per_s']:.2f}x" if p.get("acked_per_s") else "-"
                 for b in blizzard]
        rows.append(f"| {p['system']} | {p.get('acked_per_s', 0):,} | "
                    f"{'-' if cpu is None else f'{cpu:,.0f}'} | " + " | ".join(cells) + " |")
    return "\n".join(rows)
