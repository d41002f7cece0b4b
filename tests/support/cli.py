"""The ``blizzard`` command as users run it: a process of its own, its master from the
environment."""

from __future__ import annotations

import os
import subprocess
import sys

BLIZZARD = [sys.executable, "-m", "blizzard.cli"]


def run(*args: str, master: str, stdin: bytes = b"",
        check: bool = True) -> subprocess.CompletedProcess:
    """``blizzard ARGS`` against ``master``; with ``check``, any exit but 0 fails the test."""
    env = dict(os.environ, BLIZZARD_MASTER=master)
    proc = subprocess.run([*BLIZZARD, *args], input=stdin, capture_output=True, env=env,
                          timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}: {proc.stdout!r}{proc.stderr!r}")
    return proc


def output(master: str, *args: str) -> str:
    """What ``blizzard ARGS`` against ``master`` printed, once it exited 0."""
    return run(*args, master=master).stdout.decode()
