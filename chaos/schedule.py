"""The fault schedule: which fault, when, against what, for how long -- a pure function of the seed.

Faults run in three lanes. The ``cluster`` lane runs one fault at a time (kills, wipes,
pauses of data nodes and of the master, and -- with hosts in network namespaces,
``chaos.hosts`` -- partitions), so at most one node is down from it; the ``churn``
lane kills and restarts one random data node at a time at a configured rate; the
``consumers`` lane makes consumers stall past their lease. With five data nodes and R=3 that
leaves three live nodes for every write, and a wipe never takes a replica the others lack
(the nemesis waits for full replication before one, see ``chaos.nemesis``).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from itertools import pairwise
from typing import Any

KILL_NODE = "kill_node"  # kill -9 a data node; restart it with its disk
WIPE_NODE = "wipe_node"  # kill -9 a data node; restart it with an empty disk
KILL_MASTER = "kill_master"  # kill -9 the master; restart it on the same WAL
PAUSE_NODE = "pause_node"  # SIGSTOP a data node past the dead timeout, then SIGCONT
PAUSE_MASTER = "pause_master"  # SIGSTOP the master past a lease, then SIGCONT
STALL_CONSUMER = "stall_consumer"  # a consumer holds its batch past the lease before acking
CHURN = "churn"  # kill -9 a random data node; restart it with its disk
CUT_NODE = "cut_node"  # a data node cut off from the master, not from clients or other nodes
CUT_CLIENT = "cut_client"  # a client host cut off from every other host
FLAP_LINK = "flap_link"  # a data node's link goes down and up, again and again
CUT_MASTER = "cut_master"  # the primary master cut off from every host (needs a standby)
PARTITIONS = (CUT_NODE, CUT_CLIENT, FLAP_LINK, CUT_MASTER)  # faults that need hosts
MASTER_TARGETED = (KILL_MASTER, PAUSE_MASTER, CUT_MASTER)  # their target is None
DATA_NODE_FAULTS = (KILL_NODE, WIPE_NODE, PAUSE_NODE, CUT_NODE, FLAP_LINK, CHURN)  # one node
CLIENT_FAULTS = (STALL_CONSUMER, CUT_CLIENT)  # a client, not the cluster

LANES = {KILL_NODE: "cluster", WIPE_NODE: "cluster", KILL_MASTER: "cluster",
         PAUSE_NODE: "cluster", PAUSE_MASTER: "cluster", STALL_CONSUMER: "consumers",
         CHURN: "churn", **{kind: "cluster" for kind in PARTITIONS}}
GAP_S = 1.0  # quiet time after each fault of a lane, so its effects show on their own


@dataclass(frozen=True)
class Fault:
    """One planned fault."""

    at_s: float  # seconds after the workload starts
    kind: str
    target: int | None  # data node, consumer or client host index; None for the master
    duration_s: float  # down, paused or stalled for this long

    @property
    def lane(self) -> str:
        return LANES[self.kind]

    def describe(self) -> str:
        what = "master" if self.target is None else (
            f"consumer-{self.target}" if self.kind == STALL_CONSUMER else
            f"client{self.target}" if self.kind == CUT_CLIENT else f"datanode{self.target}")
        return f"{self.at_s:7.2f}s  {self.kind:<15} {what:<11} for {self.duration_s:.2f}s"


@dataclass(frozen=True, kw_only=True)
class FaultPlan:
    """How many faults of each kind a run gets (the defaults fit a 60 s run)."""

    node_kills: int = 2
    node_wipes: int = 1
    master_kills: int = 2
    node_pauses: int = 2
    master_pauses: int = 1
    consumer_stalls: int = 2
    churn_per_min: float = 0.0  # churn kills per minute, for the whole run
    node_cuts: int = 0  # partitions: these four need hosts (``chaos.hosts``)
    client_cuts: int = 0
    link_flaps: int = 0
    master_cuts: int = 0  # only with a standby master, which takes over

    def counts(self) -> dict[str, int]:
        """Faults of the cluster lane, by kind."""
        return {KILL_NODE: self.node_kills, WIPE_NODE: self.node_wipes,
                KILL_MASTER: self.master_kills, PAUSE_NODE: self.node_pauses,
                PAUSE_MASTER: self.master_pauses, CUT_NODE: self.node_cuts,
                CUT_CLIENT: self.client_cuts, FLAP_LINK: self.link_flaps,
                CUT_MASTER: self.master_cuts}

    @property
    def partitions(self) -> int:
        return self.node_cuts + self.client_cuts + self.link_flaps + self.master_cuts

    def scaled(self, factor: float) -> FaultPlan:
        """The same mix for a run ``factor`` times as long (churn is a rate and stays)."""
        def n(x: int) -> int:
            return round(x * factor)
        return FaultPlan(node_kills=n(self.node_kills), node_wipes=n(self.node_wipes),
                         master_kills=n(self.master_kills), node_pauses=n(self.node_pauses),
                         master_pauses=n(self.master_pauses),
                         consumer_stalls=n(self.consumer_stalls), churn_per_min=self.churn_per_min,
                         node_cuts=n(self.node_cuts), client_cuts=n(self.client_cuts),
                         link_flaps=n(self.link_flaps), master_cuts=n(self.master_cuts))


@dataclass(frozen=True, kw_only=True)
class Timing:
    """The cluster's timeouts the faults are measured against, and the quiet edges of a run."""

    dead_after_s: float = 1.5
    lease_s: float = 2.0
    warmup_s: float = 3.0  # no fault before this
    cooldown_s: float = 3.0  # every fault is over this long before the end


def _duration(rng: random.Random, kind: str, t: Timing) -> float:
    low, high = {
        KILL_NODE: (0.5, 2 * t.dead_after_s + 1.0),  # back before or after being declared dead
        WIPE_NODE: (t.dead_after_s + 0.5, t.dead_after_s + 2.5),
        KILL_MASTER: (0.3, 2.0),
        PAUSE_NODE: (t.dead_after_s + 0.5, t.dead_after_s + 2.5),
        PAUSE_MASTER: (t.lease_s + 0.5, t.lease_s + 2.0),
        STALL_CONSUMER: (t.lease_s + 0.5, t.lease_s + 2.0),
        CHURN: (0.3, 2 * t.dead_after_s),
        CUT_NODE: (t.dead_after_s + 0.5, t.dead_after_s + 2.5),  # declared dead while cut
        CUT_CLIENT: (t.lease_s + 0.5, t.lease_s + 2.0),  # its leases run out
        FLAP_LINK: (2 * t.dead_after_s, 2 * t.dead_after_s + 3.0),
        CUT_MASTER: (t.lease_s + 0.5, t.lease_s + 3.0),
    }[kind]
    return round(rng.uniform(low, high), 3)


def _place(rng: random.Random, durations: list[float], start: float, end: float) -> list[float]:
    """Start times for back-to-back faults in [start, end]: random slack, no overlap."""
    busy = sum(durations) + GAP_S * len(durations)
    free = end - start - busy
    if free < 0:
        raise ValueError(f"{len(durations)} faults need {busy:.1f}s but the run leaves "
                         f"{end - start:.1f}s for them; lengthen the run or plan fewer faults")
    cuts = sorted(rng.uniform(0, free) for _ in durations)
    slack = [b - a for a, b in pairwise([0.0, *cuts])]
    starts, cursor = [], start
    for pause, dur in zip(slack, durations, strict=True):
        cursor += pause
        starts.append(round(cursor, 3))
        cursor += dur + GAP_S
    return starts


def make_schedule(seed: int, duration_s: float, *, datanodes: int, consumers: int,
                  plan: FaultPlan = FaultPlan(), timing: Timing = Timing(), clients: int = 0,
                  standby: bool = False) -> list[Fault]:
    """Every fault of a run, ordered by start time; the same arguments give the same list.

    ``clients``: client hosts (partitions need hosts); ``standby``: a standby master exists,
    so the master may be cut off (without one that fault only stops the cluster).
    """
    rng = random.Random(seed)
    start, end = timing.warmup_s, duration_s - timing.cooldown_s
    if end <= start:
        raise ValueError(f"a {duration_s:g}s run is shorter than its warm-up and cool-down")
    if plan.partitions and not clients:
        raise ValueError("partition faults need hosts in network namespaces (--hosts)")
    if plan.master_cuts and not standby:
        raise ValueError("cutting the master off needs a standby master to take over")
    faults: list[Fault] = []

    kinds = [kind for kind, n in plan.counts().items() for _ in range(n)]
    rng.shuffle(kinds)
    durations = [_duration(rng, kind, timing) for kind in kinds]
    for kind, at, dur in zip(kinds, _place(rng, durations, start, end), durations, strict=True):
        target = None if kind in MASTER_TARGETED else \
            rng.randrange(clients) if kind == CUT_CLIENT else rng.randrange(datanodes)
        faults.append(Fault(at, kind, target, dur))

    if consumers:
        durations = [_duration(rng, STALL_CONSUMER, timing) for _ in range(plan.consumer_stalls)]
        for at, dur in zip(_place(rng, durations, start, end), durations, strict=True):
            faults.append(Fault(at, STALL_CONSUMER, rng.randrange(consumers), dur))

    if plan.churn_per_min > 0:
        t = start
        while True:
            t += rng.expovariate(plan.churn_per_min / 60.0)
            dur = _duration(rng, CHURN, timing)
            if t + dur > end:
                break
            faults.append(Fault(round(t, 3), CHURN, rng.randrange(datanodes), dur))
            t += dur + GAP_S

    return sorted(faults, key=lambda f: (f.at_s, f.kind))


def to_json(faults: list[Fault]) -> list[dict[str, Any]]:
    return [asdict(f) for f in faults]


def from_json(rows: list[dict[str, Any]]) -> list[Fault]:
    return [Fault(**row) for row in rows]
