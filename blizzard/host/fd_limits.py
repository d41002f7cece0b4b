"""A server's file descriptors: the soft limit raised at start, a reserve kept for its files,
and telling "out of descriptors" apart from a failing disk.

Every connection a server accepts holds a descriptor, and so does every WAL segment,
checkpoint and LevelDB table it opens. Connections may take at most the soft limit less a
reserve (``connection_fds``), so the files always find descriptors. That cap is the
process's, not a socket's: every socket that accepts connections (a master's requests port,
its heads feed, its metrics endpoint) takes from one ``ConnectionBudget``
(``process_connections``); ``blizzard/server/conn_guard.py`` and
``blizzard/net/http_guard.py`` enforce it. (Per socket, two sockets of a master under a
limit of 600 could take 344 each, more than the process had, and the reserve was gone.)
Should they run out all the same (another part of the process, a limit lowered under a
running server), ``is_fd_pressure`` says so: the caller retries later instead of stopping
as it would for a broken disk.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import threading

log = logging.getLogger(__name__)

RESERVE_MIN_FDS = 256  # kept for files at least (a quarter of the soft limit when that is more)
_PRESSURE = (errno.EMFILE, errno.ENFILE)
_PRESSURE_TEXTS = tuple(os.strerror(e) for e in _PRESSURE)  # as LevelDB's errors spell them


def soft_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def raise_fd_limit() -> tuple[int, int, int]:
    """Raise this process's soft descriptor limit to its hard limit (systemd's default soft
    limit, 1,024, is low for a server). (soft, hard, soft before) afterwards; a refusal is
    logged, the outcome is for ``log_fd_limits`` once the server serves (a server that cannot
    start says one line, its reason)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    was = soft
    if hard != resource.RLIM_INFINITY and soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the file descriptor limit from %d to %d: %s",
                        soft, hard, exc)
    return soft, hard, was


def log_fd_limits(soft: int, hard: int, was: int) -> None:
    """Log the limits ``raise_fd_limit`` left and the reserve kept of them."""
    log.info("file descriptors: soft limit %d%s, hard limit %s; %d kept for files, %d for "
             "connections", soft, f" (raised from {was})" if soft != was else "",
             "unlimited" if hard == resource.RLIM_INFINITY else hard, reserve_fds(soft),
             connection_fds(soft))


def reserve_fds(soft: int | None = None) -> int:
    """Descriptors no connection may take: for the WAL, checkpoints, LevelDB, outgoing
    connections and ZeroMQ's own."""
    soft = soft_limit() if soft is None else soft
    return min(max(RESERVE_MIN_FDS, soft // 4), soft // 2)


def connection_fds(soft: int | None = None) -> int:
    """How many accepted connections one process may hold, all its sockets together."""
    soft = soft_limit() if soft is None else soft
    return max(1, soft - reserve_fds(soft))


class ConnectionBudget:
    """The accepted connections a process holds, counted across all its sockets: a
    connection is admitted only if it ``take``s a place under the cap, and ``give``s it back
    when it ends. Thread-safe (each guard runs in a thread of its own)."""

    def __init__(self) -> None:
        self.used = 0
        self._lock = threading.Lock()

    def take(self, cap: int) -> bool:
        """One place, if fewer than ``cap`` are taken; False: none left."""
        with self._lock:
            if self.used >= cap:
                return False
            self.used += 1
            return True

    def give(self, n: int = 1) -> None:
        with self._lock:
            self.used = max(0, self.used - n)


# A process has one descriptor limit, so its connections have one budget: shared by whatever
# guards sockets in it, whoever made them (a server, its heads feed, its metrics endpoint).
_PROCESS_CONNECTIONS = ConnectionBudget()


def process_connections() -> ConnectionBudget:
    """This process's ``ConnectionBudget`` (capped by ``connection_fds``)."""
    return _PROCESS_CONNECTIONS


def leveldb_open_files(soft: int | None = None) -> int:
    """LevelDB's ``max_open_files`` (its table cache): half the reserve, 1,000 (LevelDB's own
    default) at most, so a large store cannot take the descriptors the rest needs."""
    return max(32, min(1000, reserve_fds(soft) // 2))


def is_fd_pressure(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) is the process or system running out of file
    descriptors (EMFILE, ENFILE): retry later, it is not the disk failing."""
    seen = 0
    while exc is not None and seen < 8:
        if getattr(exc, "errno", None) in _PRESSURE:
            return True
        text = str(exc)
        if any(t in text for t in _PRESSURE_TEXTS):  # plyvel.IOError carries LevelDB's text
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False
