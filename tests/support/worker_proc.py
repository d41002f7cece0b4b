"""``blizzard worker`` as a process, running a module of tasks written into a directory."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

BLIZZARD = [sys.executable, "-m", "blizzard.cli"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start_worker(jobs_dir, master: str, *args: str, module: str = "jobs",
                 out: str = "out") -> subprocess.Popen:
    """``blizzard worker MODULE`` in ``jobs_dir`` (its tasks may write to ``$JOBS_OUT``)."""
    env = dict(os.environ, JOBS_OUT=str(jobs_dir / out))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    return subprocess.Popen([*BLIZZARD, "worker", module, "--master", master, *args],
                            cwd=jobs_dir, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout_s: float = 30) -> tuple[int, str]:
    """Wait for the worker to end: its exit code and output."""
    out, _ = proc.communicate(timeout=timeout_s)
    return proc.returncode, out


@contextlib.contextmanager
def running_worker(jobs_dir, master: str, *args: str) -> Iterator[subprocess.Popen]:
    """``start_worker`` for the ``with`` block; terminated (SIGTERM) and waited for after."""
    proc = start_worker(jobs_dir, master, *args)
    try:
        yield proc
    finally:
        proc.terminate()
        finish(proc)
