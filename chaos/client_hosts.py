"""The workload of a ``--hosts`` run, spread over client hosts: one process on each.

Producer ``i`` and consumer ``i`` run on client host ``i % clients``, the dead-letter
consumer on host 0. Each host runs ``chaos.client_host`` in its network namespace, writes
its own history (merged into the run's at the end, ``history.merge``) and is steered
through its stdin: this object offers what the run and the nemesis ask of a ``Workload``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from chaos.client_host import SLOT
from chaos.history import INFO, History
from chaos.workload import DEAD_LETTER_CONSUMER, WorkloadConfig, worker_names

log = logging.getLogger(__name__)


class ClientHost:
    """One client host's process: commands in, answers out, its log in the run dir."""

    def __init__(self, index: int, argv: list[str], log_path: str) -> None:
        self.index, self.name, self.argv, self.log_path = index, f"client{index}", argv, log_path
        self.popen: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()
        self._waiting: dict[str, threading.Event] = {}  # answer wanted -> set when it came

    def start(self) -> None:
        with open(self.log_path, "ab") as logfile:
            self.popen = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=logfile, text=True, start_new_session=True)
        threading.Thread(target=self._read, name=f"{self.name}-answers", daemon=True).start()

    def send(self, command: dict[str, Any], answer: str | None = None) -> threading.Event:
        """Send a command; the event is set when ``answer`` (a JSON line) comes back."""
        event = threading.Event()
        assert self.popen is not None and self.popen.stdin is not None
        with self._lock:
            if answer is not None:
                self._waiting[answer] = event
            try:
                self.popen.stdin.write(json.dumps(command) + "\n")
                self.popen.stdin.flush()
            except (BrokenPipeError, ValueError):  # it exited; its exit status says why
                log.error("%s is gone; %s not sent", self.name, command["op"])
        return event

    def _read(self) -> None:
        assert self.popen is not None and self.popen.stdout is not None
        for line in self.popen.stdout:
            with self._lock:
                event = self._waiting.pop(line.strip(), None)
            if event is not None:
                event.set()

    def stop(self, timeout_s: float) -> int:
        """Close its stdin (it stops its workers and exits), wait, kill if it hangs; its status."""
        assert self.popen is not None
        with self._lock:
            if self.popen.stdin is not None and not self.popen.stdin.closed:
                try:
                    self.popen.stdin.close()
                except BrokenPipeError:
                    pass
        try:
            return self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.error("%s did not stop within %.0fs: killed", self.name, timeout_s)
            self.popen.kill()
            return self.popen.wait()

    def tail(self, nbytes: int = 1500) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(max(0, os.path.getsize(self.log_path) - nbytes))
            return f.read().decode(errors="replace")


class RemoteConsumer:
    """A consumer on a client host, as the nemesis sees it: it can be told to stall."""

    def __init__(self, name: str, host: ClientHost) -> None:
        self.name, self.host = name, host

    def stall(self, duration_s: float) -> threading.Event:
        return self.host.send({"op": "stall", "name": self.name, "duration_s": duration_s},
                              answer=json.dumps({"stalled": self.name}))


class ClientHosts:
    """The workload on ``clients`` client hosts (``prefix(name)`` runs a command on one)."""

    def __init__(self, prefix: Callable[[str], tuple[str, ...]], clients: int, master: str,
                 history: History, config: WorkloadConfig, seed: int, run_dir: str,
                 python: str = sys.executable) -> None:
        self.history, self.run_dir = history, run_dir
        self.progress_path = os.path.join(run_dir, "progress.bin")
        with open(self.progress_path, "wb") as f:
            f.write(bytes(SLOT.size * clients))
        shares: list[list[str]] = [[] for _ in range(clients)]
        for name in worker_names(config):
            i = 0 if name == DEAD_LETTER_CONSUMER else int(name.rsplit("-", 1)[1]) % clients
            shares[i].append(name)
        self.hosts = []
        for i, names in enumerate(shares):
            spec = {"index": i, "hosts": clients, "names": names, "master": master,
                    "seed": seed, "t0": history.t0, "config": asdict(config),
                    "progress_path": self.progress_path,
                    "history_path": os.path.join(run_dir, f"history-client{i}.jsonl"),
                    "log_level": logging.getLevelName(logging.getLogger().getEffectiveLevel())}
            self.hosts.append(ClientHost(i, [*prefix(f"client{i}"), python, "-m",
                                             "chaos.client_host", json.dumps(spec)],
                                         os.path.join(run_dir, f"client{i}.log")))
        self.consumers = [RemoteConsumer(f"consumer-{i}", self.hosts[i % clients])
                          for i in range(config.consumers)]

    @property
    def history_paths(self) -> list[str]:
        return [os.path.join(self.run_dir, f"history-client{h.index}.jsonl") for h in self.hosts]

    def start(self) -> None:
        for host in self.hosts:
            host.start()

    def stop_producers(self, timeout_s: float = 60.0) -> None:
        self._everywhere("stop_producers", timeout_s)

    def drain(self) -> None:
        self._everywhere("drain", 10.0)

    def stop_consumers(self, timeout_s: float = 60.0) -> None:
        """Stop every host's workers and its process; one that failed is recorded as a crash."""
        for host in self.hosts:
            if host.popen is None or host.popen.returncode is not None:
                continue
            status = host.stop(timeout_s)
            if status != 0:
                self.history.record("monitor", INFO, "crash", {"process": host.name,
                                                               "status": status,
                                                               "log": host.tail()})

    def _everywhere(self, op: str, timeout_s: float) -> None:
        answers = [(h, h.send({"op": op}, answer=json.dumps({"done": op}))) for h in self.hosts
                   if h.popen is not None and h.popen.poll() is None]
        for host, answered in answers:
            if not answered.wait(timeout_s):
                log.error("%s did not answer %s within %.0fs", host.name, op, timeout_s)
