"""Read-only inspection of a master data dir: what a restart would find, without starting."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from blizzard import protocol
from master import checkpoint
from master.state import State
from master.wal import WalCorrupt, _is_torn_tail, list_segments, scan, segment_name


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
    wal_dir = os.path.join(data_dir, "wal")
    report = Report()
    if not os.path.isdir(wal_dir):
        report.verdict = "empty"
        report.problems.append(f"{wal_dir} does not exist: a fresh master would start empty")
        return report
    state, start = State(), 0
    try:
        found = checkpoint.load_latest(wal_dir)
    except WalCorrupt as exc:
        report.verdict = "corrupt"
        report.problems.append(str(exc))
        return report
    if found is not None:
        start, exported = found
        state = State.restore(exported)
        report.checkpoint = checkpoint.checkpoint_name(start)
    segments = [i for i in list_segments(wal_dir) if i >= start]
    for n, index in enumerate(segments):
        path = os.path.join(wal_dir, segment_name(index))
        with open(path, "rb") as f:
            data = f.read()
        bodies, good_end, problem = scan(data)
        report.segments.append((segment_name(index), len(bodies), len(data)))
        for body in bodies:
            state.apply(protocol.unpack(body))
        if problem is not None:
            where = f"{path}: {problem} at byte offset {good_end}"
            if n == len(segments) - 1 and _is_torn_tail(data, good_end, problem):
                report.verdict = "torn"
                report.problems.append(f"{where}; a start truncates {len(data) - good_end} bytes")
            else:
                report.verdict = "corrupt"
                report.problems.append(f"{where}; the master refuses to start")
                break
    report.items = len(state.items)
    report.id_hi = state.id_hi
    report.queues = {q.name: (q.n_ready, q.n_delayed, q.n_leased) for q in state.queues.values()}
    return report
