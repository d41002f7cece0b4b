"""One server process of a local cluster, and where it runs (``blizzard/local/harness.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass

from blizzard.net.defaults import LOOPBACK


@dataclass
class Proc:
    """One server process with its log file."""

    name: str
    argv: list[str]
    log_path: str
    addr: str
    popen: subprocess.Popen | None = None
    log_start: int = 0  # where this run's lines begin in the (appended) log file
    env: dict[str, str] | None = None  # variables set over the inherited environment

    def start(self) -> Proc:
        log = open(self.log_path, "ab")
        self.log_start = log.tell()
        env = {**os.environ, **self.env} if self.env else None
        self.popen = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True, env=env)
        log.close()
        return self

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive:
            assert self.popen is not None
            os.kill(self.popen.pid, sig)

    def kill(self) -> None:
        """SIGKILL and reap: a crash, as far as the process can tell."""
        if self.popen is not None:
            if self.popen.poll() is None:
                self.popen.kill()
            self.popen.wait()

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, wait, then SIGKILL."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGCONT)
            self.popen.terminate()
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

    def head(self, nbytes: int = 64_000) -> str:
        """The first lines this run logged (what a process says as it starts)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_start)
                return f.read(nbytes).decode(errors="replace")
        except OSError:
            return ""

    def tail(self, nbytes: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - nbytes))
                return f.read().decode(errors="replace")
        except OSError:
            return ""


@dataclass(frozen=True)
class Placement:
    """Where a server process runs: a command prefix (``ip netns exec NS``) and the address
    it binds. The default is here, on loopback."""

    prefix: tuple[str, ...] = ()
    host: str = LOOPBACK
