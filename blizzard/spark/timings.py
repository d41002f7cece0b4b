"""Where a streaming read spends its time, stage by stage, for ``scripts/bench --spark``.

With the source option ``timingsDir`` set, the driver's runner (lease, plan, ack, keep-alive)
and every executor task (fetch, Arrow, and the time Spark took to consume each Arrow batch:
converting and writing it) append one JSON line per stage and batch to a file of their own
in that directory; ``summarize`` adds them up. Off by default: nothing is measured or written.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Timings:
    """Stage durations of one process, appended to ``DIR/<stage owner>-<random>.jsonl``."""

    def __init__(self, directory: str | None, owner: str) -> None:
        self.path = (os.path.join(directory, f"{owner}-{uuid.uuid4().hex[:8]}.jsonl")
                     if directory else None)

    def __bool__(self) -> bool:
        return self.path is not None

    def add(self, stage: str, seconds: float, items: int = 0) -> None:
        if self.path is None:
            return
        line = json.dumps({"stage": stage, "s": round(seconds, 6), "items": items,
                           "at": time.time(), "pid": os.getpid()})  # at: when it ended
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    @contextmanager
    def stage(self, name: str, items: int = 0) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.add(name, time.monotonic() - started, items)


def records(directory: str) -> list[dict[str, Any]]:
    """Every record written to ``directory``, in no particular order."""
    out = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".jsonl"):
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                out += [json.loads(line) for line in f]
    return out


def summarize(directory: str) -> dict[str, Any]:
    """Seconds and items per stage over every file in ``directory``: ``{stage: {"s", "items",
    "calls"}}``. Executor stages add up over tasks that ran in parallel."""
    total: dict[str, dict[str, float]] = defaultdict(lambda: {"s": 0.0, "items": 0, "calls": 0})
    for rec in records(directory):
        t = total[rec["stage"]]
        t["s"] += rec["s"]
        t["items"] += rec["items"]
        t["calls"] += 1
    return {stage: {"s": round(t["s"], 3), "items": int(t["items"]), "calls": int(t["calls"])}
            for stage, t in sorted(total.items())}
