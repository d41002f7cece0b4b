"""What a running task may ask of its job: progress, cancellation, the state a retry resumes
from. ``blizzard.progress(...)``, ``blizzard.cancelled()``, ``blizzard.last_state()``.

Each runner thread runs one job at a time; the job's ``JobContext`` is that thread's while the
task runs. The worker's loop (the only thread that talks to the cluster) reads the progress a
task left (``take_progress``) and sends it on the job's next lease extension, at most once per
``PROGRESS_EVERY_S``; an extension's answer may say the job was cancelled, which sets the
context's flag. A task sees it at its next safe point: ``cancelled()`` or ``progress()``
raises ``Cancelled`` there (a task that never calls either runs to its end, and its result is
kept, shown as cancel requested).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from blizzard.client.message import Message
from blizzard.wire.codec import dumps, loads
from blizzard.wire.errors import InvalidArgument, ProtocolError
from blizzard.wire.limits import MAX_NOTE_CHARS, MAX_STATE_BYTES

PROGRESS_EVERY_S = 1.0  # the most often a job's progress rides on an extension


class Cancelled(Exception):
    """Raised in a task at a safe point (``blizzard.cancelled()``, ``blizzard.progress()``)
    once its job was cancelled: let it propagate (after cleaning up), and the worker acks
    the job as cancelled."""


@dataclass
class JobContext:
    """One leased job's side of the conversation with its task."""

    msg: Message
    cancel: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    unsent: tuple[float, str, bytes] | None = None  # progress not yet sent
    sent_at: float = 0.0  # monotonic: when progress last rode on an extension

    def take_progress(self, now: float, force: bool = False) -> tuple[float, str, bytes] | None:
        """The progress to send now (None: none, or sent less than ``PROGRESS_EVERY_S`` ago
        unless ``force``)."""
        with self.lock:
            if self.unsent is None or (not force and now - self.sent_at < PROGRESS_EVERY_S):
                return None
            taken, self.unsent, self.sent_at = self.unsent, None, now
            return taken

    def due(self, now: float) -> bool:
        return self.unsent is not None and now - self.sent_at >= PROGRESS_EVERY_S


_local = threading.local()


def _current() -> JobContext | None:
    """The job this thread runs, or None: the task was called directly (``fn(...)``), where
    progress goes nowhere, nothing is cancelled and there is no earlier state or tick."""
    return getattr(_local, "job", None)


def running(ctx: JobContext | None) -> None:
    """The runner thread runs ``ctx``'s job now (None: none)."""
    _local.job = ctx


def progress(fraction: float, note: str = "", state: Any = None) -> None:
    """Record the job's progress: ``fraction`` done (0 to 1), a ``note`` for people (200
    characters at most), and a ``state`` (msgpack types, 16 KiB encoded at most) that a retry
    of this job gets back from ``last_state()``. Sent on the job's next lease extension
    (within about a second); a later call before then replaces it. A safe point: raises
    ``Cancelled`` if the job was cancelled. Called outside a worker's job (the task called
    directly), it checks its arguments and does nothing."""
    ctx = _current()
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) \
            or not 0.0 <= fraction <= 1.0:
        raise InvalidArgument(f"progress is a fraction in [0, 1], got {fraction!r}")
    if not isinstance(note, str) or len(note) > MAX_NOTE_CHARS:
        raise InvalidArgument(f"a progress note is text of at most {MAX_NOTE_CHARS} characters")
    saved = b""
    if state is not None:
        try:
            saved = dumps(state)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidArgument(f"a progress state must be msgpack types: {exc}") from None
        if len(saved) > MAX_STATE_BYTES:
            raise InvalidArgument(f"a progress state is at most {MAX_STATE_BYTES} bytes "
                                  f"encoded; this one is {len(saved)}")
    if ctx is None:
        return
    with ctx.lock:
        ctx.unsent = (float(fraction), note, saved)
    cancelled()


def cancelled() -> bool:
    """A safe point: raises ``Cancelled`` if the job was cancelled, else returns False
    (always False outside a worker's job)."""
    ctx = _current()
    if ctx is not None and ctx.cancel.is_set():
        raise Cancelled("the job was cancelled")
    return False


def cancel_requested() -> bool:
    """Whether the job was cancelled, without raising (for a task that cleans up first)."""
    ctx = _current()
    return ctx is not None and ctx.cancel.is_set()


def last_state() -> Any:
    """The state an earlier attempt of this job saved with ``progress(state=...)``, or None:
    a retry resumes from it (None outside a worker's job)."""
    ctx = _current()
    saved = ctx.msg.state if ctx is not None else b""
    if not saved:
        return None
    try:
        return loads(saved)
    except ProtocolError:
        return None


def current_tick() -> float | None:
    """The tick (unix time) a scheduled job runs for, or None for a job of no schedule (and
    outside a worker's job)."""
    ctx = _current()
    return (ctx.msg.tick or None) if ctx is not None else None


def current_job() -> Message | None:
    """The running job's message (its ``id``, ``queue``, ``attempts``, ...); None outside a
    worker's job."""
    ctx = _current()
    return ctx.msg if ctx is not None else None
