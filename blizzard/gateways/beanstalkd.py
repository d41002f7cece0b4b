"""``blizzard beanstalkd``: beanstalkd's protocol in front of a replicated Blizzard cluster.

Each connection (TCP, or a Unix socket's: ``--listen unix:PATH``) is a ``Session``
(``beanstalk_session.py``) in a thread of its own, with its own ``Client``: a tube is a
queue; ``put`` is an enqueue (``INSERTED`` once the master's WAL and W data nodes hold it);
``reserve`` a dequeue, the job leased in the cluster and owned
by this connection; ``delete`` an ack, ``release`` a nack, ``bury`` a move to the dead-letter
queue, ``touch`` a lease extension, ``kick`` a redrive. What a connection reserved and did
not settle is given back when it closes. Job ids are Blizzard's item ids. The puts and
deletes of all connections go to the cluster in batches (``batcher.py``): what many
connections send at once costs about what one connection's does.

This module is the gateway itself: it accepts connections (at most ``max_connections``; more
are closed at once, and an accept out of descriptors waits), knows the tubes it made, and
holds the batcher the sessions share.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from blizzard.client.core import Client
from blizzard.gateways.batcher import Batcher
from blizzard.gateways.beanstalk_session import Session
from blizzard.gateways.beanstalk_stats import GatewayCounters
from blizzard.host.log_limit import Throttled
from blizzard.host.unix_listener import UnixListener
from blizzard.wire.errors import QueueExists

log = logging.getLogger(__name__)
# accept() failures that pass: out of descriptors or buffers, a connection reset while queued
_ACCEPT_AGAIN = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED}
trouble = Throttled(log)  # what clients cause, one line per 10 s per kind

POLL_S = 0.5  # how often the accept loop looks whether the gateway stops
MAX_CONNECTIONS = 1024
MAX_JOB_BYTES = 65_535  # beanstalkd's default (-z)


def _raise_fd_limit() -> None:
    """Descriptors up to the hard limit: each connection costs about a dozen."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


@dataclass(frozen=True)
class GatewayConfig:
    master: str
    listen_host: str = "127.0.0.1"
    listen_port: int = 11300
    max_connections: int = MAX_CONNECTIONS
    max_job_bytes: int = MAX_JOB_BYTES
    timeout_s: float = 30.0  # each cluster call's
    admin: bool = False  # speak with the admin key: kick and deleting jobs not reserved need it
    listen_path: str = ""  # a Unix socket's path to listen on instead of the host and port
    socket_mode: int = 0o660  # the Unix socket's mode: who may connect


class BeanstalkdGateway:
    """Accepts connections and runs a ``Session`` for each, in a thread."""

    def __init__(self, config: GatewayConfig,
                 client_factory: Callable[[], Client] | None = None) -> None:
        self.config = config
        # a ZeroMQ context of its own, with room for every session's sockets (about 8 each:
        # the master's and the data nodes' connections and their handshake watches)
        self.ctx = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, 64 + 16 * config.max_connections)
        _raise_fd_limit()
        self.client_factory = client_factory or (
            lambda: Client(config.master, timeout_s=config.timeout_s, admin=config.admin,
                           ctx=self.ctx))
        self.unix = UnixListener(config.listen_path, config.socket_mode) \
            if config.listen_path else None
        self.listener = self.unix.sock if self.unix is not None else socket.create_server(
            (config.listen_host, config.listen_port), backlog=128)
        self.listener.settimeout(POLL_S)
        self.port = 0 if self.unix is not None else self.listener.getsockname()[1]
        self.stopping = threading.Event()
        self.draining = threading.Event()  # beanstalkd's drain mode: puts answered DRAINING
        self.sessions: set[Session] = set()
        self.tubes: set[str] = set()  # tubes known to exist (``ensure_tube``)
        self._batcher: Batcher | None = None
        self.connections = 0  # ever accepted
        self.lock = threading.Lock()
        self.started = time.time()
        self.counters = GatewayCounters()  # what beanstalkd counts and the cluster does not
        self.server_id = os.urandom(8).hex()

    def serve_forever(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if self.stopping.is_set():
                    return
                if exc.errno not in _ACCEPT_AGAIN:
                    raise
                trouble("accept", "cannot accept a connection now: %s", exc)
                time.sleep(0.1)  # (the descriptors free up as connections end)
                continue
            with self.lock:
                full = len(self.sessions) >= self.config.max_connections
                session = None if full else Session(self, conn)
                if session is not None:
                    self.sessions.add(session)
                    self.connections += 1
            if session is None:
                trouble("full", "connection refused: %d connections, the most this gateway "
                        "takes (--max-connections)", self.config.max_connections)
                conn.close()
                continue
            threading.Thread(target=session.run, name="beanstalkd-session", daemon=True).start()

    def ensure_tube(self, client: Client, tube: str) -> None:
        """Make a tube this gateway has not seen yet as beanstalkd has it: no limit on
        releases (``max_attempts`` 0; a queue made otherwise keeps its own settings)."""
        if tube in self.tubes:
            return
        try:
            client.create_queue(tube, max_attempts=0)
        except QueueExists:
            pass
        with self.lock:
            if len(self.tubes) > 100_000:
                self.tubes.clear()
            self.tubes.add(tube)

    def ended(self, session: Session) -> None:
        with self.lock:
            self.sessions.discard(session)

    @property
    def batcher(self) -> Batcher:
        """The puts and deletes of all connections, sent in batches (made on first use)."""
        with self.lock:
            if self._batcher is None:
                self._batcher = Batcher(self.client_factory)
            return self._batcher

    def drain(self) -> None:
        """Enter drain mode, as beanstalkd on SIGUSR1: every put is answered ``DRAINING``
        from now on, the rest is served; there is no way back but a restart."""
        if not self.draining.is_set():
            log.info("drain mode: puts are refused (DRAINING) from now on")
        self.draining.set()

    @property
    def address(self) -> str:
        """Where it listens: ``unix:PATH`` or ``HOST:PORT``."""
        if self.unix is not None:
            return f"unix:{self.unix.path}"
        return f"{self.config.listen_host}:{self.port}"

    def stop(self) -> None:
        self.stopping.set()
        self.listener.close()
        if self.unix is not None:
            self.unix.remove()
        if self._batcher is not None:
            self._batcher.stop()
