"""One client host of a chaos run with ``--hosts``: its share of the workload, in its own process.

``chaos.client_hosts`` starts ``python -m chaos.client_host SPEC`` in the host's network
namespace (SPEC: JSON, see ``ClientHosts``). The workers record into their own history file
with the run's clock (``t0``: monotonic time is one clock for every process of the machine),
merged with the run's history at the end. Commands come as JSON lines on stdin, answers go
as JSON lines to stdout:

- ``{"op": "stall", "name": "consumer-1", "duration_s": 3.1}`` -> ``{"stalled": "consumer-1"}``
  once that consumer held a batch that long;
- ``{"op": "stop_producers"}``, ``{"op": "drain"}`` -> ``{"done": OP}``;
- stdin closed: stop every worker, close the history and exit.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import sys
import threading
from typing import Any

from chaos.history import History
from chaos.workload import Progress, Workload, WorkloadConfig

SLOT = struct.Struct("<qq")  # one host's acknowledged and seen counts in the progress file


class SharedProgress(Progress):
    """The run's backlog, shared by its client hosts through a small file.

    Slot ``index`` holds this host's acknowledged and seen counts; the backlog is the sum over
    all slots. An item seen on two hosts (a redelivery) counts twice, so the backlog may be a
    little low: it only paces the workload. Sequence numbers are ``index``, ``index + hosts``,
    ..., so no two hosts use one.
    """

    def __init__(self, path: str, index: int, hosts: int) -> None:
        super().__init__()
        self.index, self.hosts = index, hosts
        self._fd = os.open(path, os.O_RDWR)

    def take(self, n: int) -> list[int]:
        return [s * self.hosts + self.index for s in super().take(n)]

    def enqueued(self, n: int) -> None:
        super().enqueued(n)
        self._publish()

    def dequeued(self, seqs: list[int | None]) -> None:
        super().dequeued(seqs)
        self._publish()

    def _publish(self) -> None:
        with self._lock:
            mine = SLOT.pack(self.acknowledged, len(self.seen))
        os.pwrite(self._fd, mine, SLOT.size * self.index)

    @property
    def backlog(self) -> int:
        data = os.pread(self._fd, SLOT.size * self.hosts, 0)
        return sum(acked - seen for acked, seen in SLOT.iter_unpack(data))


class Replies:
    """JSON lines to stdout, one writer at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        with self._lock:
            sys.stdout.write(json.dumps(message) + "\n")
            sys.stdout.flush()


def serve(workload: Workload, replies: Replies) -> None:
    """Carry out commands from stdin until it closes."""
    consumers = {c.name: c for c in workload.consumers}
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        if op == "stall":
            done = consumers[command["name"]].stall(command["duration_s"])
            threading.Thread(target=_when_set, args=(done, replies, {"stalled": command["name"]}),
                             daemon=True).start()
        elif op == "stop_producers":
            workload.stop_producers()
            replies.send({"done": op})
        elif op == "drain":
            workload.drain()
            replies.send({"done": op})
        else:
            raise ValueError(f"unknown command {op!r}")


def _when_set(event: threading.Event, replies: Replies, message: dict[str, Any]) -> None:
    event.wait()
    replies.send(message)


def main() -> None:
    spec = json.loads(sys.argv[1])
    logging.basicConfig(level=spec.get("log_level", "INFO"),
                        format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s")
    progress = SharedProgress(spec["progress_path"], spec["index"], spec["hosts"])
    replies = Replies()
    with History(spec["history_path"], t0=spec["t0"]) as history:
        workload = Workload(spec["master"], history, WorkloadConfig(**spec["config"]),
                            spec["seed"], progress=progress, names=spec["names"])
        workload.start()
        try:
            serve(workload, replies)
        finally:
            workload.stop_producers()
            workload.stop_consumers()


if __name__ == "__main__":
    main()
