"""Read-only inspection of a master data dir: what a restart would find, without starting."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from master.log import checkpoint_file
from master.log.wal import WalCorrupt, read_segments
from master.state import records
from master.state.machine import State


@dataclass
class Report:
    """What ``check`` found; ``verdict`` is ok, torn (repairable at start) or corrupt."""

    verdict: str = "ok"
    problems: list[str] = field(default_factory=list)
    checkpoint: str | None = None
    segments: list[tuple[str, int, int]] = field(default_factory=list)  # (name, records, bytes)
    items: int = 0
    queues: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # ready, delayed, leased
    id_hi: int = 0


def check(data_dir: str) -> Report:
    """Load the checkpoint and replay every segment in memory, changing nothing on disk."""
    return recover(data_dir)[0]


def recover(data_dir: str) -> tuple[Report, State]:
    """``check``'s report and the state a restart would find (as far as it could be read)."""
    wal_dir = os.path.join(data_dir, "wal")
    report = Report()
    state, start = State(), 0
    if not os.path.isdir(wal_dir):
        report.verdict = "empty"
        report.problems.append(f"{wal_dir} does not exist: a fresh master would start empty")
        return report, state
    try:
        found = checkpoint_file.load_latest(wal_dir)
    except WalCorrupt as exc:
        report.verdict = "corrupt"
        report.problems.append(str(exc))
        return report, state
    if found is not None:
        start, exported = found
        state = State.restore(exported)
        report.checkpoint = checkpoint_file.checkpoint_name(start)
    for seg in read_segments(wal_dir, start):
        report.segments.append((os.path.basename(seg.path), len(seg.bodies), seg.size))
        for body in seg.bodies:
            state.apply(records.unpack(body))
        if seg.problem is not None:
            where = f"{seg.path}: {seg.problem} at byte offset {seg.good_end}"
            if seg.torn:
                report.verdict = "torn"
                torn = seg.size - seg.good_end
                report.problems.append(f"{where}; a start truncates {torn} bytes")
            else:
                report.verdict = "corrupt"
                report.problems.append(f"{where}; the master refuses to start")
                break
    report.items = len(state.items)
    report.id_hi = state.id_hi
    report.queues = {q.name: (q.n_ready, q.n_delayed, q.n_leased) for q in state.queues.values()}
    return report, state


def armed_ticks(wal_dir: str, item: int) -> list[float]:
    """Every tick a master armed a schedule's ``item`` for, in log order, read from its WAL
    directory (as far as it goes back: checkpoints may have removed its start; a master
    started with ``--keep-wal`` keeps it whole). A tick listed twice was enqueued twice."""
    ticks = []
    for seg in read_segments(wal_dir):
        for body in seg.bodies:
            rec = records.unpack(body)
            if type(rec) is records.AddSchedule and rec.item == item:
                ticks.append(rec.next_at)
            elif type(rec) is records.RearmItems and item in rec.ids:
                ticks.append(rec.not_befores[rec.ids.index(item)])
    return ticks
