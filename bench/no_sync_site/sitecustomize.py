"""Unsafe, for one benchmark only: with ``BLIZZARD_BENCH_NO_SYNC=1``, no fsync and no synced
LevelDB write of this process's own (LevelDB's background work still syncs its files).

``scripts/bench --no-sync`` (and ``--workers P,C --no-sync``) puts this folder on
``PYTHONPATH`` for the cluster it starts, so every server imports it at start-up (Python's
``sitecustomize`` hook; the benchmark's client processes too, where it changes nothing).
It measures what the servers' syncs cost: an estimate of what a change in where or when
they happen could win (such as the master logging an enqueue while the data nodes store it).
A cluster run so breaks P1 and P6; nothing but that benchmark sets the variable.
"""

import os
import sys
from typing import Any


def _no_sync(fd: int) -> None:
    return None


def unsync() -> None:
    """Make this process's fsyncs and synced LevelDB writes no-ops, and say so on stderr (a
    server's log)."""
    print(f"BLIZZARD_BENCH_NO_SYNC=1: process {os.getpid()} skips its fsyncs and synced LevelDB "
          "writes; UNSAFE, for a benchmark's bound only (bench/no_sync_site)", file=sys.stderr)
    os.fsync = os.fdatasync = _no_sync
    try:
        import plyvel
    except ImportError:  # a process without plyvel has no LevelDB to change
        return
    real_db = plyvel.DB

    class UnsyncedDB:
        """plyvel's DB (which cannot be subclassed) with every write unsynced."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._db = real_db(*args, **kwargs)

        def write_batch(self, *args: Any, **kwargs: Any) -> Any:
            return self._db.write_batch(*args, **{**kwargs, "sync": False})

        def put(self, key: bytes, value: bytes, *args: Any, **kwargs: Any) -> Any:
            return self._db.put(key, value, *args, **{**kwargs, "sync": False})

        def __getattr__(self, name: str) -> Any:
            return getattr(self._db, name)

    plyvel.DB = UnsyncedDB


if os.environ.get("BLIZZARD_BENCH_NO_SYNC") == "1":  # (the notice's first words: bench/common.py)
    unsync()
