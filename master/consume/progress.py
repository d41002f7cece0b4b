"""Progress riding on a worker's extensions: checked before the extension is logged, then
logged for the items it held.

An ``Extend`` may carry progress (``progress_ids`` with a fraction, a note and a saved state
each). ``Progress.check`` refuses a malformed one with ``InvalidArgument`` before anything of
the extension is logged; ``Progress.take`` logs what the extension's held items reported as
``ProgressItems``, at most once per ``PROGRESS_EVERY_S`` a job (a worker sends it about once a
second), and drops a state the master has no room for (``MAX_PROGRESS_BYTES`` in all). What
the master keeps of it is the state's ``JobBook`` (``master/state/job_book.py``); the job
status (``master/jobs/status.py``) reads it back.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from blizzard.host.log_limit import Throttled
from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument
from blizzard.wire.limits import MAX_NOTE_CHARS, MAX_STATE_BYTES
from master.rules import arguments
from master.state.job_book import MAX_PROGRESS_BYTES
from master.state.machine import State
from master.state.records import ProgressItems

log = logging.getLogger(__name__)
too_much_progress = Throttled(log)

PROGRESS_EVERY_S = 0.5  # a job's progress is logged at most this often (the WAL's share)


class Progress:
    """Progress intake for ``Leases.extend``: the check, then the log."""

    def __init__(self, state: State, log_record: Callable[[Any], None]) -> None:
        self.state = state
        self.log = log_record
        self.logged_at: dict[int, float] = {}  # job -> when its progress was last logged

    def check(self, msg: p.Extend) -> None:
        """``InvalidArgument`` if an extension's progress is malformed."""
        arguments.same_length(progress_ids=msg.progress_ids, fractions=msg.fractions,
                              notes=msg.notes, states=msg.states)
        for fraction, note, saved in zip(msg.fractions, msg.notes, msg.states, strict=True):
            if not (math.isfinite(fraction) and 0.0 <= fraction <= 1.0):
                raise InvalidArgument(f"progress is a fraction in [0, 1], got {fraction!r}")
            if len(note) > MAX_NOTE_CHARS:
                raise InvalidArgument(f"a progress note has at most {MAX_NOTE_CHARS} "
                                      f"characters, got {len(note)}")
            if len(saved) > MAX_STATE_BYTES:
                raise InvalidArgument(f"a progress state is at most {MAX_STATE_BYTES} bytes "
                                      f"encoded, got {len(saved)}")

    def take(self, msg: p.Extend, held: list[int], mono: float) -> None:
        """Log the progress an extension carries (checked already) for the items it held."""
        mine = set(held)
        if len(self.logged_at) > 2 * len(self.state.held) + 1024:  # jobs gone since
            self.logged_at = {j: t for j, t in self.logged_at.items() if j in self.state.held}
        book = self.state.jobs
        room = MAX_PROGRESS_BYTES - book.progress_bytes
        ids, fractions, notes, states = [], [], [], []
        for k, job in enumerate(msg.progress_ids):
            if job not in mine or mono - self.logged_at.get(job, -1e9) < PROGRESS_EVERY_S:
                continue
            self.logged_at[job] = mono
            saved = msg.states[k]
            if len(saved) > room:
                too_much_progress("progress", "progress states fill the master's %d bytes; "
                                  "a state of job %d is dropped", MAX_PROGRESS_BYTES, job)
                saved = b""
            room -= len(saved)
            ids.append(job)
            fractions.append(msg.fractions[k])
            notes.append(msg.notes[k])
            states.append(saved)
        if ids:
            self.log(ProgressItems(ids=ids, fractions=fractions, notes=notes, states=states))
