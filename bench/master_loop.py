"""The master's own work per item, in this process: no socket, no other process, no kernel.

A real ``MasterServer`` over an in-memory WAL and a stand-in router is handed, item after
item, what one producer and one consumer calling one item at a time make it do: a placement
every 64 items, the enqueue, two data nodes' put reports, a lease (answered by a data node on
the master's order), a quiet ack, each as a pass of the loop (its handlers, its timers, its
group commit). CPU time per item (``time.process_time``) is then the Python the master runs for an
item, steady to a few percent between runs, where a loaded cluster's figures move by tens of
percent with the machine: the figure a change to the master's handlers moves, and the part
of the master's CPU per item in ``--workers`` that is not transport (receiving, sending,
waking up).

    scripts/bench --master-loop 20000
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from blizzard.wire import protocol as p
from master.config import MasterConfig
from master.log.wal import MemoryWal
from master.server import MasterServer

PRODUCER, CONSUMER = b"p" * 16, b"c" * 16  # their connections' routing ids
NODES = ("dn-a", "dn-b")


class Router:
    """Stands in for the master's socket (all of ``blizzard.server.router.Router``): nothing
    arrives; what is sent is kept, then dropped; security off."""

    admitted = None
    poller = None

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, int, Any]] = []

    def role_of(self, peer: bytes) -> None:
        return None  # security off

    def key_of(self, peer: bytes) -> str:
        return ""

    def fd_of(self, peer: bytes) -> int:
        return -1

    def departures(self) -> None:
        return None

    def receive(self, timeout_ms: int, ready: bool = False) -> list:
        return []

    def reply(self, peer: bytes, rid: int, msg: Any) -> None:
        self.sent.append((peer, rid, msg))

    def close(self) -> None:
        pass


def master() -> MasterServer:
    """A master, R=2, whose two data nodes have reported and ask for leases to answer."""
    server = MasterServer(MasterConfig(data_dir="unused", replication=2, min_replicas=2),
                          wal=MemoryWal(), router=Router())
    heartbeats(server)
    now, mono = time.time(), time.monotonic()
    for node in NODES:
        server.await_serves(p.AwaitServes(node, [], []), now, mono, node.encode(), 1)
    server.tick(now, mono)
    return server


def heartbeats(server: MasterServer) -> None:
    """Each data node's heartbeat (a node sends one a second; the loop, every 100 items)."""
    now, mono = time.time(), time.monotonic()
    for port, node in enumerate(NODES, 1):
        server.heartbeat(p.Heartbeat(node, f"tcp://127.0.0.1:{port}", 0, 0, 10**12), now, mono,
                         node.encode(), 0)


def one_pass(server: MasterServer, requests: list[tuple[bytes, int, Any]]) -> list[Any]:
    """What ``run_once`` does with ``requests``, without a socket: the replies."""
    now, mono = time.time(), time.monotonic()
    server._handle_all(requests, now, mono)
    server.pushes.flush()
    server.tick(now, mono)
    server.wal.flush()
    router = server.router
    replies = [reply for _, _, reply in server._replies + router.sent]
    server._replies, router.sent = [], []
    return replies


def leased_of(server: MasterServer, replies: list[Any]) -> p.Leased:
    """The lease's answer: sent by the master, or ordered pushed by a data node."""
    for reply in replies:
        if isinstance(reply, p.Leased):
            return reply
        if isinstance(reply, p.Serves):  # a node's order: the answer's frame, signed
            return p.decode(reply.orders[-1].answer)[1]
    raise RuntimeError(f"the lease was not answered: {replies}")


def run(n: int) -> dict[str, Any]:
    """``n`` items through one master; CPU µs per item."""
    server = master()
    placement: p.Placement | None = None
    used = 0
    started = time.process_time()
    for i in range(n):
        if i % 100 == 0:
            heartbeats(server)
        if placement is None or used == placement.n:
            placement = server.handle(PRODUCER, 1, p.Place(64, []), time.time(),
                                      time.monotonic())
            assert isinstance(placement, p.Placement), placement
            used = 0
        item = placement.first + used
        used += 1
        enqueue = p.Enqueue("q", [item], [256], [7], [0], [0.0], [""], False, f"e{i}", False,
                            5.0, placement.grant)
        assert one_pass(server, [(PRODUCER, 2 * i + 2, enqueue)]) == []  # waits for reports
        committed = one_pass(server, [(node.encode(), 0, p.PutReport(node, [item], [], ""))
                                      for node in NODES])
        assert committed == [p.Committed(1)], committed
        leased = leased_of(server, one_pass(server, [(CONSUMER, 2 * i + 3, p.Lease(
            "q", 1, 30.0, 0.0, f"l{i}", [], [], push_to=CONSUMER, push_key=b"k" * 16))]))
        # the node reports it pushed the answer, in its next ask for orders
        served = list(server.pushes.out)
        one_pass(server, [(NODES[0].encode(), 1, p.AwaitServes(NODES[0], served, [])),
                          (NODES[1].encode(), 1, p.AwaitServes(NODES[1], [], [])),
                          (CONSUMER, 0, p.Ack(leased.ids, leased.leases, True, "q"))])
    cpu_s = time.process_time() - started
    left = len(server.state.items)
    server.close()
    if left:
        raise RuntimeError(f"{left} items were not acked")
    return {"system": "blizzard", "op": "master_loop", "items": n,
            "master_cpu_us_per_item": round(cpu_s / n * 1e6, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(prog="scripts/bench --master-loop", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--master-loop", type=int, default=20000, metavar="N",
                    help="items to put through the master (default 20000)")
    args = ap.parse_args()
    if args.master_loop < 1:
        ap.error("--master-loop takes a positive number of items")
    print(json.dumps(run(args.master_loop)), flush=True)


if __name__ == "__main__":
    main()
