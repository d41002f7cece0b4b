"""Servers keep their files to themselves: data directories 0700, every file they make 0600.

WAL segments, checkpoints and LevelDB files hold payloads and item metadata; another local
user must read none of them. A server process sets its umask to ``PRIVATE_UMASK`` as it
starts (``blizzard.cli.common.start``), so every file and directory it makes (LevelDB's
included) is its own alone, and makes its data directory 0700, also one an older version
left 0755: without the directory's search bit, no other user reaches the files inside.
"""

from __future__ import annotations

import os

PRIVATE_UMASK = 0o077


def private_process() -> None:
    """From now on, files and directories this process makes are its user's alone."""
    os.umask(PRIVATE_UMASK)


def private_dir(path: str) -> None:
    """Make ``path`` (and missing parents) if needed, and mode 0700."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
