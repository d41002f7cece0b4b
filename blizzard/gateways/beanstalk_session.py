"""One connection of ``blizzard beanstalkd``: its command loop, and what each of beanstalkd's
commands does in the cluster (``beanstalkd.py`` accepts the connections).

Bounds: a command line of at most 224 bytes (longer: ``BAD_FORMAT`` and the connection is
closed), a job body of at most the gateway's ``max_job_bytes`` (``JOB_TOO_BIG``; the body is
read and dropped a piece at a time), a line or body started and not finished within
``LINE_TIMEOUT_S`` closes the connection, and so does a reply not read for ``SEND_TIMEOUT_S``.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from blizzard.client.core import Client
from blizzard.client.enqueue_options import EnqueueOptions
from blizzard.client.http_delivery import bury, lookup
from blizzard.client.message import leased_items
from blizzard.gateways import beanstalk_reports as reports
from blizzard.gateways.beanstalk_lines import (
    MAX_LINE,
    Command,
    LineError,
    line,
    parse,
    priority_of,
    with_body,
    yaml_list,
)
from blizzard.gateways.beanstalk_reports import DEFAULT_TUBE, tube_of
from blizzard.gateways.beanstalk_stats import COMMANDS, GatewayCounters
from blizzard.host.log_limit import Throttled
from blizzard.wire.errors import (
    BlizzardError,
    Forbidden,
    InUse,
    LeaseExpired,
    NotInQueue,
    UnknownItem,
)
from blizzard.wire.limits import MAX_DELAY_S, MAX_LEASE_S
from blizzard.wire.queue_settings import DEAD_SUFFIX
from blizzard.wire.shard_messages import Head

log = logging.getLogger(__name__)
trouble = Throttled(log)  # what clients cause, one line per 10 s per kind

LINE_TIMEOUT_S = 30.0  # a command line or job body begun must be finished within this
SEND_TIMEOUT_S = 60.0  # a reply the client does not read for this long ends the connection
POLL_S = 0.5  # how often a blocked read or reserve looks whether the gateway stops
DEADLINE_SOON_S = 1.0  # beanstalkd's safety margin: a reserve then says DEADLINE_SOON
SETTINGS_S = 2.0  # a tube's settings as read this long ago at most
KICK_MAX = 1000  # jobs one kick moves at most


class Gateway(Protocol):
    """What a session uses of its gateway (``beanstalkd.BeanstalkdGateway``)."""

    config: Any  # its GatewayConfig: max_job_bytes
    counters: GatewayCounters
    draining: threading.Event  # puts are refused (beanstalkd's drain mode, on SIGUSR1)
    server_id: str  # random, made when it started (beanstalkd's ``stats`` ``id``)
    stopping: threading.Event
    sessions: set[Any]
    connections: int  # accepted since it started
    started: float  # time.time() it started
    client_factory: Callable[[], Client]

    @property
    def batcher(self) -> Any: ...

    def ensure_tube(self, client: Client, tube: str) -> None: ...

    def ended(self, session: Session) -> None: ...


GONE = (LeaseExpired, UnknownItem, NotInQueue)  # the job is not this connection's any more


def _delay_s(delay: int) -> float:
    """A beanstalkd delay (up to 2**32-1 s) as the cluster takes it: at most a year."""
    return min(float(delay), MAX_DELAY_S)


def _ttr_s(ttr: int) -> float:
    """A put's ttr as the job's own lease: at least 1 s (as beanstalkd makes a ttr of 0), at
    most the cluster's longest lease (12 h)."""
    return min(max(1.0, float(ttr)), MAX_LEASE_S)


class Closed(Exception):
    """The connection ended (the peer closed it, it broke a bound, or the gateway stops)."""


class Session:
    """One client connection: its tubes, the jobs it reserved, its command loop."""

    def __init__(self, gateway: Gateway, conn: socket.socket) -> None:
        self.gateway = gateway
        self.conn = conn
        self.buf = bytearray()
        self.used = DEFAULT_TUBE
        self.watched = [DEFAULT_TUBE]
        self.reserved: dict[int, Any] = {}  # job id -> its leased Message
        self.deadlines: dict[int, float] = {}  # job id -> when its lease ends (monotonic)
        self._client: Client | None = None
        self._leases: dict[str, tuple[float, float]] = {}  # tube -> (its lease_s, read when)
        # as beanstalkd counts connections: one that put a job is a producer, one that
        # reserved is a worker, one in a reserve now is waiting
        self.produced = self.worked = self.waiting = False

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = self.gateway.client_factory()
        return self._client

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        self.conn.settimeout(POLL_S)
        try:
            while True:
                raw = self._read_line()
                try:
                    cmd = parse(raw)
                except LineError as exc:
                    self._send(line(exc.word))
                    continue
                if cmd.name == "quit":
                    return
                reply = self.handle(cmd)
                if reply:
                    self._send(reply)
        except Closed:
            pass
        except Exception:  # a bug costs this connection, never the gateway
            log.exception("internal error in a beanstalkd session")
        finally:
            self._close()

    def _close(self) -> None:
        try:
            if self.reserved and self._client is not None:
                for msg in list(self.reserved.values()):
                    try:
                        msg.nack(delay_s=0.0)  # given back: as beanstalkd does at a close
                    except BlizzardError:
                        pass  # its lease had run out: the cluster gives it back anyway
            if self._client is not None:
                self._client.close()
        except Exception:
            log.exception("closing a beanstalkd session")
        finally:
            self.conn.close()
            self.gateway.ended(self)

    def _recv(self, started: float | None) -> bytes:
        """Some bytes; ``Closed`` at the peer's end, a stop, or a line or body begun more than
        ``LINE_TIMEOUT_S`` ago (however its bytes trickle in)."""
        while True:
            if self.gateway.stopping.is_set():
                raise Closed()
            wait = POLL_S
            if started is not None:
                left = started + LINE_TIMEOUT_S - time.monotonic()
                if left <= 0:
                    trouble("slow", "a command line or job body unfinished after %gs: "
                            "connection closed", LINE_TIMEOUT_S)
                    raise Closed()
                wait = min(wait, left)
            self.conn.settimeout(wait)
            try:
                data = self.conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                raise Closed() from None
            if not data:
                raise Closed()
            return data

    def _gone(self) -> bool:
        """The peer closed its end (checked while a reserve waits; bytes it sent stay)."""
        try:
            self.conn.settimeout(0)
            return self.conn.recv(1, socket.MSG_PEEK) == b""
        except (BlockingIOError, TimeoutError):
            return False
        except OSError:
            return True

    def _read_line(self) -> bytes:
        started = time.monotonic() if self.buf else None
        while True:
            end = self.buf.find(b"\r\n")
            if 0 <= end <= MAX_LINE - 2:
                raw = bytes(self.buf[:end])
                del self.buf[:end + 2]
                return raw
            if end > MAX_LINE - 2 or len(self.buf) > MAX_LINE:
                self._send(line("BAD_FORMAT"))
                trouble("line", "a command line over %d bytes: connection closed", MAX_LINE)
                raise Closed()
            self.buf += self._recv(started)
            if started is None:
                started = time.monotonic()

    def _read_body(self, n: int) -> bytes | None:
        """The ``n`` bytes of a job and their CRLF; None if they are not followed by CRLF."""
        started = time.monotonic()
        while len(self.buf) < n + 2:
            self.buf += self._recv(started)
        body, tail = bytes(self.buf[:n]), bytes(self.buf[n:n + 2])
        del self.buf[:n + 2]
        return body if tail == b"\r\n" else None

    def _skip_body(self, n: int) -> None:
        """Read and drop a body too big to take (bounded: a piece at a time)."""
        started, left = time.monotonic(), n + 2
        while left > 0:
            if not self.buf:
                self.buf += self._recv(started)
            take = min(left, len(self.buf))
            del self.buf[:take]
            left -= take

    def _send(self, data: bytes) -> None:
        """All of ``data``; a reader that takes none of it for ``SEND_TIMEOUT_S`` is cut."""
        try:
            self.conn.settimeout(SEND_TIMEOUT_S)
            self.conn.sendall(data)
        except OSError:
            raise Closed() from None

    # -- commands ------------------------------------------------------------------------------

    def handle(self, cmd: Command) -> bytes:
        handler = getattr(self, "cmd_" + cmd.name.replace("-", "_"), None)
        if handler is None:
            return line("UNKNOWN_COMMAND")  # in the protocol, not served here yet
        if cmd.name in COMMANDS:  # as beanstalkd: once parsed (kick-job and others: not)
            self.gateway.counters.command(cmd.name)
        try:
            reply: bytes = handler(*cmd.args)
            return reply
        except Closed:
            raise
        except BlizzardError as exc:
            trouble(type(exc).__name__, "%s failed: %s: %s", cmd.name, type(exc).__name__,
                    exc.message)
            return line("INTERNAL_ERROR")
        except TimeoutError as exc:
            trouble("timeout", "%s failed: the cluster did not answer: %s", cmd.name, exc)
            return line("INTERNAL_ERROR")
        except Exception as exc:  # e.g. out of sockets: this command fails, not the session
            trouble("internal", "%s failed: %s: %s", cmd.name, type(exc).__name__, exc)
            return line("INTERNAL_ERROR")

    def cmd_put(self, pri: int, delay: int, ttr: int, n: int) -> bytes:
        if n > self.gateway.config.max_job_bytes:
            self._send(line("JOB_TOO_BIG"))  # at once, as beanstalkd; then the body is dropped
            self._skip_body(n)
            return b""
        self.produced = True  # as beanstalkd: once a put's size is taken
        body = self._read_body(n)
        if body is None:
            return line("EXPECTED_CRLF")
        if pri > 2**32 - 1 or delay > 2**32 - 1 or ttr > 2**32 - 1:
            return line("BAD_FORMAT")
        if self.gateway.draining.is_set():  # (SIGUSR1) as beanstalkd: the body read, refused
            return line("DRAINING")
        self.gateway.ensure_tube(self.client, self.used)
        opts = EnqueueOptions.make(priority_of(pri), _delay_s(delay), lease_s=_ttr_s(ttr))
        item_id = self.gateway.batcher.put(self.used, body, opts)  # with other connections
        self.gateway.counters.put(self.used)
        return line("INSERTED", item_id)

    def cmd_use(self, tube: str) -> bytes:
        self.used = tube
        return line("USING", tube)

    def cmd_watch(self, tube: str) -> bytes:
        if tube not in self.watched:
            self.watched.append(tube)
        return line("WATCHING", len(self.watched))

    def cmd_ignore(self, tube: str) -> bytes:
        if tube in self.watched:
            if len(self.watched) == 1:
                return line("NOT_IGNORED")
            self.watched.remove(tube)
        return line("WATCHING", len(self.watched))

    def cmd_list_tube_used(self) -> bytes:
        return line("USING", self.used)

    def cmd_list_tubes_watched(self) -> bytes:
        return with_body("OK", body=yaml_list(self.watched))

    def cmd_list_tubes(self) -> bytes:
        return with_body("OK", body=yaml_list(reports.tubes(self)))

    def cmd_reserve(self) -> bytes:
        return self._reserve(None)

    def cmd_reserve_with_timeout(self, seconds: int) -> bytes:
        return self._reserve(time.monotonic() + seconds)

    def _reserve(self, deadline: float | None) -> bytes:
        self.worked = True
        try:
            return self._reserve_waiting(deadline)
        finally:
            self.waiting = False

    def _reserve_waiting(self, deadline: float | None) -> bytes:
        while True:
            if self._deadline_soon():  # at the start, and as the wait goes on
                return line("DEADLINE_SOON")
            for tube in self._most_urgent_first():  # every watched tube once, without waiting
                msg = self.client.dequeue(tube)  # (each job's own ttr, else the tube's lease)
                if msg is not None:
                    return self._reserved(msg)
            left = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            if left <= 0:
                return line("TIMED_OUT")
            if self.deadlines:  # wake when a held job's margin comes
                margin = min(self.deadlines.values()) - DEADLINE_SOON_S - time.monotonic()
                left = max(0.01, min(left, margin))
            if self.gateway.stopping.is_set() or self._gone():
                raise Closed()
            tube = self.watched[0]  # then a long poll on the first, a short while
            self.waiting = True
            msg = self.client.dequeue(tube, wait_s=left)
            if msg is not None:
                return self._reserved(msg)

    def _most_urgent_first(self) -> list[str]:
        """The watched tubes, the one whose ready head is most urgent (then oldest) first, as
        beanstalkd serves the most urgent job of all watched tubes: their heads in one round
        trip to the master (none for one tube)."""
        if len(self.watched) == 1:
            return self.watched
        heads = self.client.master.call_many([Head(t) for t in self.watched])
        ready = sorted((h.priority, h.enqueued_at, k) for k, h in enumerate(heads) if h.ready)
        return [self.watched[k] for *_, k in ready] or self.watched

    def _deadline_soon(self) -> bool:
        """A job this connection holds runs out of time within the safety margin. One whose
        time ran out is not this connection's any more (the cluster gives it back)."""
        now = time.monotonic()
        for job in [job for job, end in self.deadlines.items() if end <= now]:
            self._settled(job)
        return any(end - now < DEADLINE_SOON_S for end in self.deadlines.values())

    def _reserved(self, msg: Any) -> bytes:
        self.gateway.counters.job(msg.id, "reserves")
        self.reserved[msg.id] = msg
        self.deadlines[msg.id] = time.monotonic() + self.ttr_of(msg)
        return with_body("RESERVED", msg.id, body=msg.data)

    def ttr_of(self, msg: Any, tube: str = "") -> float:
        """A job's time to run: its own (the put's ttr), else its tube's lease."""
        return float(msg.lease_s) if msg.lease_s else self._lease_s(tube or msg.queue)

    def _lease_s(self, tube: str) -> float:
        """A tube's lease (the queue's ``lease_s``): the time to run of jobs without one, as
        read at most ``SETTINGS_S`` ago (another client may change it)."""
        now = time.monotonic()
        hit = self._leases.get(tube)
        if hit is None or now - hit[1] > SETTINGS_S:
            hit = self._leases[tube] = (float(self.client.queue_config(tube)["lease_s"]), now)
        return hit[0]

    def _settled(self, job: int) -> Any | None:
        """The message of a job this connection reserved, no longer held (None: not one)."""
        self.deadlines.pop(job, None)
        return self.reserved.pop(job, None)

    def _settle(self, job: int, how: Callable[[Any], None], done: str) -> bytes:
        """Settle a job this connection reserved: forgotten once the cluster has it (or says
        the lease is gone); on any other failure it stays this connection's."""
        msg = self.reserved.get(job)
        if msg is None:
            return line("NOT_FOUND")
        try:
            how(msg)
        except GONE:
            self._settled(job)
            return line("NOT_FOUND")
        self._settled(job)
        return line(done)

    def cmd_delete(self, job: int) -> bytes:
        msg = self.reserved.get(job)
        if msg is not None:  # durable on DELETED, as beanstalkd's with -f0
            reply = self._settle(job, lambda msg: self.gateway.batcher.ack(msg.queue, msg.id,
                                                                           msg.lease), "DELETED")
            if reply == line("DELETED"):
                self._deleted(job, msg.queue)
            return reply
        found = lookup(self.client, [job]) if 0 <= job < 2**63 else []
        if not found or not found[0]["queue"]:
            return line("NOT_FOUND")
        try:
            self.client.delete(found[0]["queue"], job)
        except (UnknownItem, InUse, NotInQueue):  # another connection holds it: as beanstalkd
            return line("NOT_FOUND")
        except Forbidden:
            trouble("admin", "delete of a job not reserved here needs the admin key "
                    "(blizzard beanstalkd --admin)")
            return line("INTERNAL_ERROR")
        self._deleted(job, tube_of(found[0]["queue"]))
        return line("DELETED")

    def _deleted(self, job: int, tube: str) -> None:
        self.gateway.counters.deleted(tube)
        self.gateway.counters.forget_job(job)

    def cmd_release(self, job: int, pri: int, delay: int) -> bytes:
        if pri > 2**32 - 1:
            return line("BAD_FORMAT")
        return self._counted(job, "releases", self._settle(
            job, lambda msg: self.client.leases.nack_ids(
                [msg.id], [msg.lease], delay_s=_delay_s(delay), queue=msg.queue,
                priority=priority_of(pri)), "RELEASED"))

    def _counted(self, job: int, counter: str, reply: bytes) -> bytes:
        """``reply``, having counted ``counter`` for ``job`` if it says the command was done."""
        if not reply.startswith(b"NOT_FOUND"):
            self.gateway.counters.job(job, counter)
        return reply

    def cmd_bury(self, job: int, pri: int) -> bytes:
        if pri > 2**32 - 1:
            return line("BAD_FORMAT")
        return self._counted(job, "buries", self._settle(
            job, lambda msg: bury(self.client, [msg], "buried (beanstalkd)", priority_of(pri)),
            "BURIED"))

    def cmd_touch(self, job: int) -> bytes:
        msg = self.reserved.get(job)
        if msg is None:
            return line("NOT_FOUND")
        try:
            msg.extend(self.ttr_of(msg))
        except GONE:
            self._settled(job)
            return line("NOT_FOUND")
        self.deadlines[job] = time.monotonic() + self.ttr_of(msg)
        return line("TOUCHED")

    def cmd_kick(self, bound: int) -> bytes:
        """Up to ``bound`` buried jobs of the used tube back to ready; if it has none, up to
        ``bound`` delayed ones ready now (as beanstalkd)."""
        if bound == 0:
            return line("KICKED", 0)
        n = min(bound, KICK_MAX)
        admin = self.client.admin
        try:
            jobs = [i.id for i in admin.peek_items(self._dead_tube(), n)]
            if not jobs:
                jobs = [i.id for i in admin.peek_items(self.used, n, delayed=True)]
            done = admin.redrive(self.used, len(jobs), ids=jobs) if jobs else 0
        except Forbidden:
            trouble("admin", "kick needs the admin key (blizzard beanstalkd --admin)")
            return line("INTERNAL_ERROR")
        for job in jobs[:done]:
            self.gateway.counters.job(job, "kicks")
        return line("KICKED", done)

    def _dead_tube(self) -> str:
        """Where the used tube's buried jobs are: its dead-letter queue."""
        return str(self.client.queue_config(self.used)["dead_letter"]) or self.used + DEAD_SUFFIX

    def cmd_peek_ready(self) -> bytes:
        head = self.client.peek(self.used, 1)
        if not head:
            return line("NOT_FOUND")
        return with_body("FOUND", head[0].id, body=head[0].data)

    def cmd_peek(self, job: int) -> bytes:
        where = self._where(job)
        if where is None:
            return line("NOT_FOUND")
        return self._found(self.client.admin.peek_items(where, ids=[job]))

    def cmd_peek_delayed(self) -> bytes:
        return self._found(self.client.admin.peek_items(self.used, delayed=True))

    def _found(self, items: list[Any]) -> bytes:
        """``FOUND`` with the first of ``items`` and its payload (``NOT_FOUND``: none, or
        none of its replicas could be read)."""
        if not items:
            return line("NOT_FOUND")
        payloads, _ = self.client.fetch(items[:1])
        data = payloads.get(items[0].id)
        if data is None:
            return line("NOT_FOUND")
        return with_body("FOUND", items[0].id, body=data)

    def _where(self, job: int) -> str | None:
        """The queue job ``job`` is in now (a buried one: its dead-letter queue), or None."""
        found = lookup(self.client, [job]) if 0 <= job < 2**63 else []
        return found[0]["queue"] if found and found[0]["queue"] else None

    def cmd_kick_job(self, job: int) -> bytes:
        """A buried job back to its tube, or a delayed one ready now (the admin key)."""
        where = self._where(job)
        if where is None:
            return line("NOT_FOUND")
        try:
            done = self.client.admin.redrive(where, 1, ids=[job])
        except Forbidden:
            trouble("admin", "kick-job needs the admin key (blizzard beanstalkd --admin)")
            return line("INTERNAL_ERROR")
        if done:
            self.gateway.counters.job(job, "kicks")
        return line("KICKED") if done else line("NOT_FOUND")

    def cmd_reserve_job(self, job: int) -> bytes:
        """Job ``job`` reserved by this connection, whatever its state but reserved."""
        where = self._where(job)
        if where is None:
            return line("NOT_FOUND")
        leased = self.client.leases.lease_columns(where, 1, ids=[job])
        got = self.client.deliver(where, leased_items(leased)) if leased.ids else []
        if not got:
            return line("NOT_FOUND")
        return self._reserved(got[0])

    def cmd_pause_tube(self, tube: str, delay: int) -> bytes:
        """No job of the tube is reserved for ``delay`` seconds (the queue's ``paused_until``,
        kept by the master for every client; the admin key)."""
        try:
            self.client.configure_queue(tube, paused_until=time.time() + _delay_s(delay)
                                        if delay else 0.0)
        except Forbidden:
            trouble("admin", "pause-tube needs the admin key (blizzard beanstalkd --admin)")
            return line("INTERNAL_ERROR")
        self.gateway.counters.paused(tube)
        return line("PAUSED")

    def cmd_peek_buried(self) -> bytes:
        head = self.client.peek(self._dead_tube(), 1)
        if not head:
            return line("NOT_FOUND")
        return with_body("FOUND", head[0].id, body=head[0].data)

    def cmd_stats(self) -> bytes:
        return reports.stats(self)

    def cmd_stats_tube(self, tube: str) -> bytes:
        return reports.stats_tube(self, tube)

    def cmd_stats_job(self, job: int) -> bytes:
        return reports.stats_job(self, job)
