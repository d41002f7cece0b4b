"""The jobs lane of a chaos run: a schedule and chains of dependent jobs under the same faults.

Beside the main workload (which checks items: nothing lost, nothing made up), this lane checks
what the job features promise once:

- **A schedule ticks once per tick.** A schedule every second in ``chaos-jobs.ticks``; a
  consumer runs its ticks (``Message.tick``). At the end the master's WAL is read: every tick
  it armed the schedule's item for appears once (``AddSchedule``, ``RearmItems``), never twice,
  and every tick run is one it armed. (A run may happen twice, at least once; a tick is not
  enqueued twice.)
- **Dependencies keep their order and lose nothing.** Chains of three jobs, each waiting on
  the one before, in ``chaos-jobs.flow``; a consumer acks them. No job is leased before the ack
  of its dependency was sent, and every chain's last job is done by the end.

The lane has its own client and threads and writes ``jobs.json`` in the run directory.
Checkpoints may truncate the WAL's start, so runs before the first tick still in the WAL
are not checked against it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

from blizzard import Client
from blizzard.wire.errors import BlizzardError
from master.log.inspect import armed_ticks

log = logging.getLogger(__name__)

TICKS, FLOW = "chaos-jobs.ticks", "chaos-jobs.flow"
SCHEDULE = "chaos-tick"
CHAIN = 3
CHAIN_EVERY_S = 0.5
MAX_CHAINS = 400  # bounded: at most this many chains per run


class JobsLane:
    """A producer of chains, a consumer of ticks and chains; ``check`` after the run."""

    def __init__(self, masters: str, timeout_s: float) -> None:
        self.masters, self.timeout_s = masters, timeout_s
        self.stop_producing = threading.Event()
        self.stop_consuming = threading.Event()
        self.lock = threading.Lock()
        self.chains: list[list[int]] = []  # job ids, in order
        self.leased_at: dict[int, float] = {}  # job -> when it was first leased (monotonic)
        self.ack_sent_at: dict[int, float] = {}  # job -> when its ack was first sent
        self.acked: set[int] = set()
        self.ticks_run: list[float] = []
        self.schedule_job = 0
        self.errors: dict[str, int] = {}
        self.threads = [threading.Thread(target=self._produce, name="jobs-producer", daemon=True),
                        threading.Thread(target=self._consume, args=(TICKS,), name="jobs-ticks",
                                         daemon=True),
                        threading.Thread(target=self._consume, args=(FLOW,), name="jobs-flow",
                                         daemon=True)]

    def start(self) -> None:
        with Client(self.masters, timeout_s=self.timeout_s) as c:
            self.schedule_job = c.schedule(SCHEDULE, TICKS, b"tick", every_s=1.0).job
        for t in self.threads:
            t.start()

    def finish(self, timeout_s: float = 60.0) -> None:
        """Stop making chains; let the consumers finish what was made; stop them."""
        self.stop_producing.set()
        deadline = time.monotonic() + timeout_s
        # the chain being made goes in when it is whole: waited for, or the consumers could
        # stop before its later links come out (its first already acked)
        self.threads[0].join(timeout_s)
        while time.monotonic() < deadline:
            with self.lock:
                if all(chain[-1] in self.acked for chain in self.chains):
                    break
            time.sleep(0.2)
        self.stop_consuming.set()
        for t in self.threads:
            t.join(self.timeout_s + 5)

    def _error(self, where: str, exc: BlizzardError) -> None:
        with self.lock:
            key = f"{where}: {type(exc).__name__}"
            self.errors[key] = self.errors.get(key, 0) + 1

    def _produce(self) -> None:
        with Client(self.masters, timeout_s=self.timeout_s) as c:
            while not self.stop_producing.wait(CHAIN_EVERY_S) and len(self.chains) < MAX_CHAINS:
                chain: list[int] = []
                try:
                    for k in range(CHAIN):
                        chain.append(c.enqueue(FLOW, b"link-%d" % k, depends_on=chain[-1:]))
                except BlizzardError as exc:  # a chain cut short: its made links still count
                    self._error("enqueue", exc)
                if chain:
                    with self.lock:
                        self.chains.append(chain)

    def _consume(self, queue: str) -> None:
        with Client(self.masters, timeout_s=self.timeout_s, node_timeout_s=1.0) as c:
            while not self.stop_consuming.is_set():
                try:
                    msgs = c.dequeue_many(queue, 10, lease_s=5.0, wait_s=0.5)
                except BlizzardError as exc:
                    self._error("dequeue", exc)
                    time.sleep(0.2)
                    continue
                now = time.monotonic()
                with self.lock:
                    for m in msgs:
                        self.leased_at.setdefault(m.id, now)
                        if queue == TICKS:
                            self.ticks_run.append(m.tick)
                        self.ack_sent_at.setdefault(m.id, time.monotonic())
                try:
                    c.ack_many(msgs)
                except BlizzardError as exc:  # comes back when its lease ends
                    self._error("ack", exc)
                    continue
                with self.lock:
                    self.acked.update(m.id for m in msgs)

    def check(self, wal_dirs: list[str]) -> dict[str, Any]:
        """The lane's verdict (``valid``) and its figures."""
        armed_by_wal = {d: armed_ticks(d, self.schedule_job) for d in wal_dirs
                        if os.path.isdir(d)}
        twice = {d: sorted({t for t in ticks if ticks.count(t) > 1})
                 for d, ticks in armed_by_wal.items()}
        armed = {round(t, 6) for ticks in armed_by_wal.values() for t in ticks}
        first = min(armed, default=float("inf"))
        unarmed = sorted({t for t in self.ticks_run if t >= first and round(t, 6) not in armed})
        order = [(chain[k], chain[k + 1]) for chain in self.chains for k in range(len(chain) - 1)
                 if chain[k + 1] in self.leased_at and
                 (chain[k] not in self.ack_sent_at or
                  self.leased_at[chain[k + 1]] < self.ack_sent_at[chain[k]])]
        unfinished = [chain for chain in self.chains if chain[-1] not in self.acked]
        result = {"ticks_armed": len(armed), "ticks_armed_twice": twice,
                  "ticks_run": len(self.ticks_run), "ticks_run_unarmed": unarmed[:20],
                  "chains": len(self.chains), "chains_unfinished": unfinished[:20],
                  "order_violations": order[:20], "errors": self.errors}
        result["valid"] = not any(twice.values()) and not unarmed and not order \
            and not unfinished and bool(self.chains) and bool(self.ticks_run)
        return result


def write(run_dir: str, result: dict[str, Any]) -> None:
    with open(os.path.join(run_dir, "jobs.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1, sort_keys=True)
