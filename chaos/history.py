"""The run's history: one JSON object per line for every invoke and its outcome.

Shaped like a Jepsen history. Each op has ``index``, ``time`` (seconds since the run
started, monotonic), ``process`` (who did it: ``producer-0``, ``consumer-1``, ``nemesis``,
...), ``type`` and ``f``, plus a ``value``:

- ``type``: ``invoke``, then exactly one of ``ok``, ``fail`` (it definitely did not happen)
  or ``info`` (indeterminate: it may or may not have happened); ``error`` says why.
- ``f``: ``enqueue`` (value ``{"seqs", "digests", "via"}`` on invoke, ``{"seqs", "ids"}`` on
  the outcome; ids are known once the items were staged), ``dequeue`` (``{"n", "queue"}``, then
  ``{"items": [[id, seq, digest, intact, attempts], ...], "dead_letter"}``), ``ack`` (value
  ``{"ids"}``; a partial failure is a ``fail`` with ``{"acked", "lost", "unknown"}``), ``drain``
  (what is left in the run's queues at the end) and the nemesis' faults (``kill_node``,
  ``pause_master``, ...).
"""

from __future__ import annotations

import heapq
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"


class History:
    """A thread-safe, append-only JSONL recorder."""

    def __init__(self, path: str, t0: float | None = None) -> None:
        self.path = path
        self.t0 = time.monotonic() if t0 is None else t0
        self._file = open(path, "w", encoding="utf-8")
        self._lock = threading.Lock()
        self._index = 0

    def now(self) -> float:
        return time.monotonic() - self.t0

    def record(self, process: str, type_: str, f: str, value: Any = None,
               error: str | None = None) -> dict[str, Any]:
        op: dict[str, Any] = {"process": process, "type": type_, "f": f, "value": value}
        if error is not None:
            op["error"] = error
        with self._lock:
            op = {"index": self._index, "time": round(self.now(), 4), **op}
            self._index += 1
            self._file.write(json.dumps(op, separators=(",", ":")) + "\n")
        return op

    def invoke(self, process: str, f: str, value: Any = None) -> dict[str, Any]:
        return self.record(process, INVOKE, f, value)

    def flush(self) -> None:
        with self._lock:
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read(path: str) -> Iterator[dict[str, Any]]:
    """The ops of a history file, in order (a torn last line, from a crashed run, is skipped)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.endswith("\n"):
                yield json.loads(line)


def merge(paths: list[str], out_path: str) -> None:
    """Merge histories recorded on one clock (the run's and its client hosts') into
    ``out_path`` in time order, renumbering ``index``; ``out_path`` may be one of ``paths``."""
    streams = [list(read(path)) for path in paths]
    ops = heapq.merge(*streams, key=lambda op: op["time"])  # stable: ties keep file order
    with open(out_path, "w", encoding="utf-8") as f:
        for index, op in enumerate(ops):
            f.write(json.dumps({**op, "index": index}, separators=(",", ":")) + "\n")
