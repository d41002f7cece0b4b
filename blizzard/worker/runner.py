"""The threads of a worker that run jobs: a leased message in, an ``Outcome`` out.

Threads, not processes: a job of a work queue mostly waits (on a disk, a database, an HTTP
call, or C code such as an image library that releases the GIL), and threads share the
worker's one connection, so all of them together lease and ack in batches. CPU-bound Python
jobs want one ``blizzard worker`` process per core instead.

Only the worker's loop talks to the cluster (a ``Client`` is not thread-safe): runner threads
take messages from one queue and put outcomes on another.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass

from blizzard.client.message import Message
from blizzard.wire.errors import BlizzardError, ProtocolError
from blizzard.worker.context import Cancelled, JobContext, running
from blizzard.worker.results import encode_result
from blizzard.worker.task import Task, close_thread_client, decode_call

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 2000  # what the master keeps of a nack's error


@dataclass(slots=True)
class Outcome:
    """How one job went: ``error`` "" is success; ``poison``: no attempt can succeed on this
    worker (an unknown task name: another worker may know it); ``bury``: no attempt can
    succeed on any worker (a payload that is not a task call)."""

    msg: Message
    error: str = ""
    poison: bool = False
    bury: bool = False
    seconds: float = 0.0  # how long the task ran
    task: Task | None = None
    result: bytes = b""  # the result's payload (``results.encode_result``) of a success
    cancelled: bool = False  # the task stopped at a safe point after a cancel


def describe(exc: BaseException) -> str:
    """A failed job's error text: the exception and the line that raised it."""
    text = f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        text += f" (at {last.filename}:{last.lineno} in {last.name})"
    return text[:MAX_ERROR_CHARS]


def run_job(tasks: Mapping[str, Task], ctx: JobContext) -> Outcome:
    """Decode a message's call, run its task (with ``ctx`` as its job's context), and say how
    it went, with its result encoded; never raises."""
    msg = ctx.msg
    try:
        name, args, kwargs = decode_call(msg.data)
    except ProtocolError as exc:
        return Outcome(msg, f"undecodable task payload: {exc.message}", bury=True)
    found = tasks.get(name)
    if found is None:
        return Outcome(msg, f"unknown task {name[:200]!r}: this worker runs "
                            f"{', '.join(sorted(tasks))[:1000]}", poison=True)
    if ctx.cancel.is_set():  # cancelled while it waited for a thread
        return Outcome(msg, task=found, cancelled=True)
    try:
        found.check_call(args, kwargs)
    except BlizzardError as exc:  # no attempt can succeed: buried at once
        return Outcome(msg, f"TypeError: {exc.message}", bury=True, task=found)
    started = time.perf_counter()
    running(ctx)
    try:
        value = found.fn(*args, **kwargs)
    except Cancelled:
        return Outcome(msg, seconds=time.perf_counter() - started, task=found, cancelled=True)
    except BaseException as exc:  # a job's sys.exit() must not end its thread either
        return Outcome(msg, describe(exc), seconds=time.perf_counter() - started, task=found)
    finally:
        running(None)
    seconds = time.perf_counter() - started
    try:
        blob = encode_result(value, msg.attempts + 1, seconds) if found.keeps_results else b""
    except BlizzardError as exc:  # not msgpack, or too large: no retry can help
        return Outcome(msg, f"{type(exc).__name__}: {exc.message}", bury=True, seconds=seconds,
                       task=found)
    return Outcome(msg, seconds=seconds, task=found, result=blob)


class Runner:
    """``concurrency`` threads running jobs from ``submit``; ``outcomes`` collects results."""

    def __init__(self, tasks: Mapping[str, Task], concurrency: int) -> None:
        self.tasks = tasks
        self.todo: queue.SimpleQueue[JobContext | None] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.finished: list[Outcome] = []
        self.wake = threading.Event()  # set once ``wake_at`` outcomes are there
        self.wake_at = 1
        # daemons: a hard stop must not wait for a job that does not end
        self.threads = [threading.Thread(target=self._serve, name=f"job-{i}", daemon=True)
                        for i in range(concurrency)]
        for thread in self.threads:
            thread.start()

    def submit(self, jobs: list[JobContext]) -> None:
        for ctx in jobs:
            self.todo.put(ctx)

    def outcomes(self, timeout_s: float, at_least: int = 1) -> list[Outcome]:
        """The outcomes there, once ``at_least`` are or ``timeout_s`` has passed.

        Waking once for many outcomes, not once for each, keeps the loop from taking the GIL
        from the job threads for every job.
        """
        with self.lock:
            ready = len(self.finished) >= at_least
            if not ready:
                self.wake_at = at_least
                self.wake.clear()
        if not ready and timeout_s > 0:
            self.wake.wait(timeout_s)
        with self.lock:
            got, self.finished = self.finished, []
            self.wake_at = 1 << 62  # no wake-ups until the next call says how many
        return got

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the threads once the jobs submitted are done (each waited up to ``timeout_s``)."""
        for _ in self.threads:
            self.todo.put(None)
        for thread in self.threads:
            thread.join(timeout_s)

    def _serve(self) -> None:
        try:
            while (ctx := self.todo.get()) is not None:
                outcome = run_job(self.tasks, ctx)
                with self.lock:
                    self.finished.append(outcome)
                    if len(self.finished) >= self.wake_at:
                        self.wake.set()
        finally:
            close_thread_client()  # the client a job made to enqueue more jobs
