"""Liveness: how long the clients went without an acknowledged enqueue or dequeue, per fault.

The checker asks whether anything was lost; this asks whether the queue kept serving. For
each kind of call it finds every *stall*: a stretch in which no call of that kind was
acknowledged by anyone (an enqueue ``ok``; a dequeue ``ok`` that delivered at least one item)
while some client was asking for one. Time the workload spent idle is not a stall:

- a worker asks from its call until an acknowledged answer, through failed or empty answers
  and its retries. After anyone's acknowledgement, only the workers with a call in flight
  still ask: the others may have stopped by choice (a producer waiting for the backlog to
  shrink, a consumer leaving the standing backlog), and ask again with their next call;
- a dequeue is wanted only while some acknowledged item has not been delivered yet (the
  report's ``unseen`` series): with nothing to take, an empty answer is right.

Within a stretch without acknowledgements neither condition can lapse (only an
acknowledgement stops a worker asking or shrinks ``unseen``), so a stall is one interval:
from when both held, to the next acknowledgement.

Each fault is charged the longest stall that overlaps its window, from its start to its heal
plus ``TAIL_S`` (an effect can outlast the heal):

- a stall that began before the fault counts from the fault's start;
- a stall that runs on past the heal counts to its end, unless another fault (not a client's)
  began after the heal: from then on it is that fault's;
- a stall a master fault took part in is that master fault's from the master fault's start,
  not a concurrent data-node fault's (every client waits out a master outage; the master
  fault has its own figure).

``--max-stall-s`` judges the data-node faults (``DATA_NODE_FAULTS``) by these figures.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from chaos.schedule import CLIENT_FAULTS, DATA_NODE_FAULTS, MASTER_TARGETED

ENQUEUE, DEQUEUE = "enqueue", "dequeue"
OPS = (ENQUEUE, DEQUEUE)
ASK, GOT, MISS = "ask", "got", "miss"  # a call made; acknowledged; answered otherwise
TAIL_S = 1.0  # a fault's window runs this long past its heal


class Call(NamedTuple):
    """One step of a worker's calls of one kind: it asked (``ASK``), was acknowledged
    (``GOT``) or was answered without progress (``MISS``: failed, indeterminate, empty)."""

    time_s: float
    process: str
    event: str


@dataclass(frozen=True)
class Stall:
    """A stretch with no acknowledged ``op`` although a client was asking for one."""

    op: str
    began_s: float
    ended_s: float

    @property
    def seconds(self) -> float:
        return self.ended_s - self.began_s

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "stall_s": round(self.seconds, 3),
                "began_s": round(self.began_s, 3), "ended_s": round(self.ended_s, 3)}


@dataclass(frozen=True)
class FaultStalls:
    """The longest stall of each kind charged to one fault (``None``: none at all)."""

    kind: str
    target: int | None
    start_s: float
    end_s: float
    enqueue: Stall | None
    dequeue: Stall | None
    overlaps_master: bool = False  # a master fault's outage was left out of the figures

    @property
    def worst(self) -> Stall | None:
        return max((s for s in (self.enqueue, self.dequeue) if s is not None),
                   key=lambda s: s.seconds, default=None)

    @property
    def seconds(self) -> float:
        return self.worst.seconds if self.worst is not None else 0.0

    @property
    def data_node(self) -> bool:
        """A fault of one data node: the ones ``--max-stall-s`` judges."""
        return self.kind in DATA_NODE_FAULTS

    def to_json(self) -> dict[str, Any]:
        def secs(s: Stall | None) -> float:
            return round(s.seconds, 3) if s is not None else 0.0
        return {"kind": self.kind, "target": self.target, "start_s": round(self.start_s, 3),
                "end_s": round(self.end_s, 3), "max_no_enqueue_s": secs(self.enqueue),
                "max_no_dequeue_s": secs(self.dequeue),
                "worst": self.worst.to_json() if self.worst is not None else None,
                "data_node": self.data_node, "overlaps_master": self.overlaps_master}


@dataclass(frozen=True)
class Liveness:
    """A run's stalls: the longest of each kind, and each fault's."""

    longest: dict[str, Stall | None]
    faults: list[FaultStalls]

    def over(self, max_stall_s: float | None) -> list[FaultStalls]:
        """The data-node faults charged a stall longer than ``max_stall_s`` (none without one)."""
        if max_stall_s is None:
            return []
        return [f for f in self.faults if f.data_node and f.seconds > max_stall_s]

    def worst_data_node_fault(self) -> FaultStalls | None:
        return max((f for f in self.faults if f.data_node and f.worst is not None),
                   key=lambda f: f.seconds, default=None)

    def to_json(self) -> dict[str, Any]:
        return {"tail_s": TAIL_S,
                "longest": {op: s.to_json() if s is not None else None
                            for op, s in self.longest.items()},
                "faults": [f.to_json() for f in self.faults]}


def stalls(calls: Iterable[Call], *, op: str, until: float,
           supply: Sequence[tuple[float, int]] | None = None) -> list[Stall]:
    """Every stall of one kind of call, in time order.

    ``calls``: the workers' calls of that kind; ``supply``: for dequeues, the number of items
    there are to take as a step series ``(time, level)`` (``None``: always something to
    ask for); ``until``: when the workload stopped (a stall still open then ends there).
    """
    events: list[tuple[float, int, str, Any]] = []
    for c in calls:  # at one instant: acknowledgements first, then supply, then asking
        events.append((c.time_s, 0 if c.event == GOT else 2, c.event, c.process))
    for t, level in supply or ():
        events.append((t, 1, "supply", level))
    events.sort(key=lambda e: (e[0], e[1]))
    in_flight: set[str] = set()  # a call made, no answer yet
    retrying: set[str] = set()  # answered without progress, no acknowledgement since
    level = 0 if supply is not None else 1
    since: float | None = None
    out: list[Stall] = []

    def close(at: float) -> None:
        if since is not None and at > since:
            out.append(Stall(op, since, at))

    for t, _, event, what in events:
        if event == GOT:
            close(t)
            in_flight.discard(what)
            retrying.clear()
            since = None
        elif event == ASK:
            in_flight.add(what)
            retrying.discard(what)
        elif event == MISS:
            in_flight.discard(what)
            retrying.add(what)
        else:
            level = what
        asking = bool(in_flight or retrying) and level > 0
        if since is None and asking:
            since = t
        elif since is not None and not asking:  # only a drop of supply to 0 does this
            close(t)
            since = None
    close(until)
    return out


def longest(found: Iterable[Stall]) -> Stall | None:
    return max(found, key=lambda s: s.seconds, default=None)


def charge(faults: Sequence[Mapping[str, Any]], found: Mapping[str, Sequence[Stall]], *,
           tail_s: float = TAIL_S) -> list[FaultStalls]:
    """Each fault's longest stall of each kind (see the module's docstring for the rules).

    ``faults``: ``kind``, ``target``, ``start`` and ``end`` (seconds), as the report's
    timeline has them; ``found``: op -> its stalls in time order, as ``stalls`` gives them
    (they do not overlap, so their ends are in order too)."""
    masters = [(f["start"], f["end"] + tail_s) for f in faults if f["kind"] in MASTER_TARGETED]
    ends = {op: [s.ended_s for s in found.get(op, ())] for op in OPS}
    out = []
    for f in sorted(faults, key=lambda f: f["start"]):
        start, end = f["start"], f["end"]
        cut = min((g["start"] for g in faults
                   if g["start"] > end and g["kind"] not in CLIENT_FAULTS), default=math.inf)
        window_end = min(end + tail_s, cut)
        excuse = [] if f["kind"] in MASTER_TARGETED else masters
        worst: dict[str, Stall | None] = {}
        excused = False
        for op in OPS:
            best = None
            mine = found.get(op, ())
            for i in range(bisect.bisect_right(ends[op], start), len(mine)):  # ending after it
                s = mine[i]
                if s.began_s >= window_end:
                    break
                began, ended = max(s.began_s, start), min(s.ended_s, cut)
                for m_start, m_end in excuse:
                    if m_start < s.ended_s and m_end > s.began_s and m_start < ended:
                        ended = max(began, min(ended, max(m_start, s.began_s)))
                        excused = True
                if ended > began and (best is None or ended - began > best.seconds):
                    best = Stall(op, began, ended)
            worst[op] = best
        out.append(FaultStalls(f["kind"], f.get("target"), start, end, worst[ENQUEUE],
                               worst[DEQUEUE], excused))
    return out


def measure(calls: Mapping[str, Sequence[Call]], unseen: Sequence[tuple[float, int]],
            faults: Sequence[Mapping[str, Any]], *, tail_s: float = TAIL_S) -> Liveness:
    """A run's liveness from its calls (op -> calls), the ``unseen`` series and its faults."""
    found = {op: stalls(calls.get(op, ()), op=op,
                        until=max((c.time_s for c in calls.get(op, ())), default=0.0),
                        supply=unseen if op == DEQUEUE else None)
             for op in OPS}
    return Liveness({op: longest(s) for op, s in found.items()},
                    charge(faults, found, tail_s=tail_s))
