"""A job's result as the worker stores it, and ``JobHandle``, what an enqueue of a task returns.

A result is the msgpack array ``[RESULT_VERSION, value, attempt, finished_at, seconds]``:
the task's return value (or, for a job that ended dead, its last error; for a cancelled one,
None), the attempt that made it (1: the first), when it finished (unix time) and how long the
task ran. It is an item of ``<queue>.results``, kept for the task's ``result_ttl_s`` (else its
queue's), and at most ``MAX_RESULT_BYTES`` encoded: a task that returns more fails, saying so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from blizzard.client.jobs import JobStatus
from blizzard.wire.codec import dumps, loads
from blizzard.wire.errors import BlizzardError, InvalidArgument, ProtocolError

RESULT_VERSION = 1
MAX_RESULT_BYTES = 1024 * 1024


class JobFailed(BlizzardError):
    """Raised by ``JobHandle.result()`` for a job that ended dead: ``error`` is its last
    error (the exception its task raised, and where)."""

    code = "job_failed"

    def __init__(self, message: str = "", error: str = "") -> None:
        super().__init__(message)
        self.error = error


class JobCancelled(BlizzardError):
    """Raised by ``JobHandle.result()`` for a job that was cancelled."""

    code = "job_cancelled"


class ResultUnavailable(BlizzardError):
    """Raised by ``JobHandle.result()`` for a job that is done but whose result is not kept
    (its time to live ran out, or its task keeps none: ``result_ttl_s=0``), or a job the
    master does not know (never made, or finished and forgotten)."""

    code = "result_unavailable"


def encode_result(value: Any, attempt: int, seconds: float) -> bytes:
    """A result's payload; ``InvalidArgument`` if ``value`` is not msgpack types or its
    encoding exceeds ``MAX_RESULT_BYTES``."""
    try:
        blob = dumps([RESULT_VERSION, value, attempt, time.time(), seconds])
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgument(f"a task's return value must be msgpack types (None, bool, int, "
                              f"float, str, bytes, list, dict): {exc}") from None
    if len(blob) > MAX_RESULT_BYTES:
        raise InvalidArgument(f"a task's return value is at most {MAX_RESULT_BYTES} bytes "
                              f"encoded; this one is {len(blob)}")
    return blob


@dataclass(frozen=True)
class Result:
    value: Any
    attempt: int
    finished_at: float
    seconds: float


def decode_result(blob: bytes) -> Result:
    try:
        fields = loads(blob)
    except ProtocolError as exc:
        raise ProtocolError(f"a result that is not msgpack: {exc.message}") from None
    if type(fields) is not list or len(fields) < 5 or fields[0] != RESULT_VERSION:
        raise ProtocolError(f"not a result [{RESULT_VERSION}, value, attempt, finished_at, "
                            "seconds]")
    return Result(*fields[1:5])


class JobState(str):
    """A job's state word (``"running"``, ``"done"``, ...: it compares as that text), with
    the rest of what the master says: ``progress`` and ``note`` (its last progress),
    ``attempts``, ``runs``, ``error``, ``cancel_requested``, and ``info`` (the whole
    ``JobStatus``)."""

    info: JobStatus

    def __new__(cls, info: JobStatus) -> JobState:
        state = super().__new__(cls, info.state)
        state.info = info
        return state

    def __getattr__(self, name: str) -> Any:
        if name == "info":
            raise AttributeError(name)
        return getattr(self.info, name)


class JobHandle(int):
    """A job that was enqueued: its item id (a handle is that int, as ``enqueue`` returned
    before handles: ``handle.id`` says so), ``status()``, ``result()``, ``cancel()``.
    ``client``: a function giving the client to ask (the one that enqueued, or the thread's
    default)."""

    queue: str
    _client: Callable[[], Any]

    def __new__(cls, item_id: int, queue: str, client: Callable[[], Any]) -> JobHandle:
        handle = super().__new__(cls, item_id)
        handle.queue = queue
        handle._client = client
        return handle

    @property
    def id(self) -> int:
        return int(self)

    def info(self, *, read: bool = False) -> JobStatus:
        """Everything the master says of the job (``read``: its result's payload too)."""
        return self._client().jobs([self.id], read=read)[0]

    def status(self) -> JobState:
        """queued, delayed, waiting (for its dependencies), running, failed (its last run
        failed; a retry is due), done, dead, cancelled or unknown: a ``JobState``, that text
        with the job's ``progress``, ``note``, ``attempts``, ``runs`` and ``error``."""
        return JobState(self.info())

    def result(self, timeout_s: float = 30.0) -> Any:
        """The task's return value, waiting up to ``timeout_s`` for the job to end (the master
        answers when it does: no polling). ``TimeoutError`` if it has not ended by then;
        ``JobFailed`` if it ended dead, ``JobCancelled`` if cancelled, ``ResultUnavailable``
        if its result is not kept (or the job is unknown)."""
        seen = self._client().jobs([self.id], wait_s=timeout_s)[0]
        if not seen.final:
            raise TimeoutError(f"job {self.id} is still {seen.state} after {timeout_s:g} s")
        if seen.state == "cancelled":
            raise JobCancelled(f"job {self.id} was cancelled")
        if seen.state == "dead":
            error = seen.error or (decode_result(seen.result).value if seen.result else "")
            raise JobFailed(f"job {self.id} failed for good: {error}", str(error))
        if seen.state == "unknown":
            raise ResultUnavailable(f"the master knows no job {self.id} (never made, or it "
                                    "finished long ago and its result ran out)")
        if seen.result is None:
            raise ResultUnavailable(f"job {self.id} is done, but its result is not kept (its "
                                    "time to live ran out, or its task keeps none)")
        return decode_result(seen.result).value

    def cancel(self) -> bool:
        """Cancel the job (see ``Client.cancel``); False if it had ended already."""
        return bool(self._client().cancel([self.id]))

    def __reduce__(self) -> Any:  # pickled (to another process): the id, a plain int
        return (int, (int(self),))

    def __str__(self) -> str:
        return str(int(self))

    def __repr__(self) -> str:
        return f"<job {self.id} of {self.queue}>"
