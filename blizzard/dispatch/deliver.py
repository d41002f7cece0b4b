"""``blizzard dispatch``: deliver HTTP tasks from queues with a pool of asyncio senders (aiohttp).

The c12s task queue's worker pool. Per queue, one lease loop takes tasks in batches (up
to two rounds of work for the senders) and puts them in one shared line; ``workers``
senders take from it, make the request and hand the outcome to the settler. A 2xx reply is
success: acked, in batches. Anything else (another status, no reply within the task's
``timeout_s``, a refused or dropped connection) is a failure: nacked with the task's
``backoff_s`` as its delay and the error text, or, once the task's ``max_attempts`` are
spent, buried in the queue's dead-letter queue with that error. Each request carries
``X-Blizzard-Task`` (the id) and ``X-Blizzard-Attempt``, so an endpoint can tell a repeat.

``blizzard.Client`` blocks and is not thread-safe, so each runs in a thread of its own: one
per queue for leases (a long poll on one queue must not hold up another) and one for settling
(``settle.py``: acks, nacks and burials in batches, lease extensions). A task is held from
its lease until its outcome is settled, its lease extended when a third of it is left
(``blizzard/client/lease_keeper.py``), so a slow endpoint or a busy master does not cost it. The
tasks held bound how many more are leased, those decided and waiting to be settled too. A
dispatcher killed mid-request loses nothing: its leases run out and the tasks come back (at least
once, not exactly once).

A lease the master refuses for now (too many long polls, unavailable) is tried again after a
jittered, doubling pause; one refused for good (keys, arguments) stops the dispatcher. A loop
that raises anything else (a bug) is logged and stops the dispatcher at once, and ``run``
raises it: never a dispatcher that leases without sending, or sends without settling.

``config.allow_hosts`` limits the hosts tasks may go to (``allow_hosts.py``); a task to another
host is dead-lettered unsent.

The rate limit is the master's: a queue's token bucket admits new tasks, and retries pass
without a token (``master/state/picking.py``), so a retry keeps the back-off it asked for.
Per-queue rates give one queue priority over another.

``stop()`` (SIGTERM): no more leases; the tasks leased already are sent and settled, then the
clients close. ``stop(hard=True)`` cancels every loop at once and waits for no thread: the
requests in flight and the outcomes not yet sent are abandoned (their leases run out). A
client thread still inside a master call would hold up the interpreter's exit, so ``blizzard
dispatch`` leaves with ``os._exit`` after a hard stop.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from typing import Any

import aiohttp

from blizzard.client.api import BlizzardClient
from blizzard.client.core import Client
from blizzard.client.http_delivery import ATTEMPT_HEADER, TASK_HEADER, HttpTask
from blizzard.client.message import Message
from blizzard.dispatch.allow_hosts import HostPolicy
from blizzard.dispatch.settle import ClientThread, Delivery, Key, Settler
from blizzard.wire.errors import BlizzardError, InvalidArgument, ProtocolError, SecurityError
from blizzard.wire.limits import MAX_LEASE_S, MAX_LEASE_WAIT_S
from blizzard.wire.queue_settings import check_queue_name

log = logging.getLogger(__name__)

ERROR_BODY_BYTES = 200  # of a failed reply's body, kept in the error text
DRAIN_BYTES = 1024 * 1024  # of a reply's body read so its connection can be reused
RETRY_PAUSE_S = 0.2  # after a first refused lease; doubled after each next one ...
RETRY_MAX_S = 10.0  # ... up to this, each less up to half at random (jitter)
# a lease refused for one of these will be refused again: the dispatcher stops
REFUSED_FOR_GOOD = (SecurityError, ProtocolError, InvalidArgument)


@dataclass(frozen=True)
class DispatchConfig:
    """How a dispatcher runs; the defaults are ``blizzard dispatch``'s."""

    master: str
    queues: tuple[str, ...]
    workers: int = 16  # requests in flight at once
    lease_s: float = 30.0  # extended every third of it while a task is held
    batch: int = 100  # tasks leased at once per queue, at most
    wait_s: float = 1.0  # a lease's long poll on an empty queue
    timeout_s: float = 30.0  # the client's: master requests are retried this long
    keys: str | None = None  # a key directory; None: BLIZZARD_KEYS
    allow_hosts: tuple[str, ...] = ()  # hosts tasks may go to (``allow_hosts.py``); (): any

    def validate(self) -> DispatchConfig:
        if not self.queues:
            raise InvalidArgument("name at least one queue to dispatch from")
        for queue in self.queues:
            check_queue_name(queue)
        if not 1 <= self.workers <= 10_000 or not 1 <= self.batch <= 10_000:
            raise InvalidArgument("workers and batch must be 1..10000")
        if not 1.0 <= self.lease_s <= MAX_LEASE_S or not 0 <= self.wait_s <= MAX_LEASE_WAIT_S:
            raise InvalidArgument(f"lease_s must be 1..{MAX_LEASE_S:g} s and wait_s "
                                  f"0..{MAX_LEASE_WAIT_S:g} s")
        HostPolicy.parse(self.allow_hosts)
        return self


def retry_pause_s(failures: int, rand: Callable[[], float] = random.random) -> float:
    """How long to wait after the ``failures``-th refused lease in a row: doubling, jittered,
    so dispatchers refused together (a master restarting) do not come back together."""
    return min(RETRY_MAX_S, RETRY_PAUSE_S * 2 ** min(failures - 1, 16)) * (1 - rand() / 2)


class Dispatcher:
    """Leases tasks from ``config.queues``, sends them, settles them; ``run`` until ``stop``."""

    def __init__(self, config: DispatchConfig,
                 make_client: Callable[[], BlizzardClient] | None = None) -> None:
        self.config = config.validate()
        self.hosts = HostPolicy.parse(config.allow_hosts)
        self.make_client = make_client or (lambda: Client(config.master,
                                                          timeout_s=config.timeout_s,
                                                          keys=config.keys))
        self.totals: Counter[str] = Counter()  # leased, succeeded, retried, dead, settle_failures
        self.held: dict[Key, Delivery] = {}  # leased and not yet settled
        self.settler: Settler | None = None
        self.line: asyncio.Queue[Delivery | None] = asyncio.Queue()
        self.room = asyncio.Event()  # a task was decided or settled: room to lease more?
        self.stopping = asyncio.Event()  # no more leases
        self.hard = False  # stopped at once: requests and outcomes abandoned
        self._tasks: list[asyncio.Task] = []  # every loop (a hard stop cancels them)
        self.failure: BaseException | None = None  # what stopped the dispatcher, if not ``stop``

    async def run(self) -> Counter[str]:
        """Dispatch until ``stop``; returns the totals. A lease the cluster refuses for good
        (a key it does not admit, say) stops the dispatcher cleanly and is raised; so is an
        error in one of its loops (a bug), after a hard stop."""
        settle = ClientThread(self.make_client, "settle")
        leasers = {q: ClientThread(self.make_client, f"lease-{q}") for q in self.config.queues}
        self.settler = Settler(settle, self.held, self.config.lease_s, self.room.set)
        connector = aiohttp.TCPConnector(limit=self.config.workers)
        async with aiohttp.ClientSession(connector=connector) as session:
            loops = [self._spawn(self._lease_loop(q, t), f"lease loop of {q}")
                     for q, t in leasers.items()]
            senders = [self._spawn(self._sender(session), "sender")
                       for _ in range(self.config.workers)]
            settler = self._spawn(self.settler.run(), "settler")
            await asyncio.gather(*loops, return_exceptions=True)
            for _ in senders:
                self.line.put_nowait(None)  # each sender stops after the tasks before it
            await asyncio.gather(*senders, return_exceptions=True)
            self.settler.finish()
            await asyncio.gather(settler, return_exceptions=True)
        for thread in [*leasers.values(), settle]:
            thread.close(wait=not self.hard)  # a hard stop waits for no thread
        self.totals["settle_failures"] = self.settler.failures
        log.info("dispatcher stopped%s: %s", " at once" if self.hard else "", dict(self.totals))
        if self.failure is not None:
            raise self.failure
        return self.totals

    def stop(self, hard: bool = False) -> None:
        """Lease no more; finish what is leased (``hard``: abandon requests and outcomes)."""
        self.stopping.set()
        self.room.set()
        if hard:
            self.hard = True
            for task in self._tasks:
                task.cancel()

    def _spawn(self, loop: Coroutine[Any, Any, None], name: str) -> asyncio.Task:
        task = asyncio.create_task(self._guarded(loop, name), name=name)
        self._tasks.append(task)
        return task

    async def _guarded(self, loop: Coroutine[Any, Any, None], name: str) -> None:
        """Run a loop; if it raises, stop everything: a dispatcher missing a loop would hold
        tasks it never sends, settles or extends."""
        try:
            await loop
        except Exception as exc:  # a bug: say so, and stop rather than go on half-dead
            log.critical("the dispatcher's %s failed; stopping at once", name, exc_info=True)
            self.failure = self.failure or exc
            self.stop(hard=True)

    # -- leasing -----------------------------------------------------------------------------

    async def _lease_loop(self, queue: str, thread: ClientThread) -> None:
        """Keep the senders fed, while not stopping: lease once no more than a round of work
        (``workers`` tasks) waits to be sent or is in flight, up to two rounds; and only
        while no more than two rounds of outcomes wait for the master to settle them.

        So the senders cannot run ahead of the master (an endpoint failing at once, a master
        slow to fsync), and a round of work waits in line while the first is sent. Leases
        come in batches, not one per finished request; each queue asks for the room there is
        when it asks, so with several queues more may be held for a while.
        """
        cfg, settler = self.config, self._settler()
        refusals = 0  # leases refused in a row
        while not self.stopping.is_set():
            undecided = len(self.held) - settler.unsettled
            if undecided > cfg.workers or settler.unsettled > 2 * cfg.workers:
                self.room.clear()
                await self.room.wait()
                continue
            n = min(2 * cfg.workers - undecided, cfg.batch)
            sent = time.monotonic()  # the leases end lease_s after this, at the latest
            try:
                msgs = await thread.call(partial(_lease, queue=queue, n=n, lease_s=cfg.lease_s,
                                                 wait_s=cfg.wait_s))
            except REFUSED_FOR_GOOD as exc:  # keys, arguments: asking again will not help
                self.failure = self.failure or exc
                self.stop()
                return
            except BlizzardError as exc:  # the master busy or restarting, data nodes down
                refusals += 1
                self._log_refusal(queue, exc, refusals)
                await self._pause(retry_pause_s(refusals))
                continue
            if refusals:
                log.info("leasing from %s works again, after %d refusals", queue, refusals)
                refusals = 0
            for msg in msgs:
                self._admit(msg, sent + cfg.lease_s)

    @staticmethod
    def _log_refusal(queue: str, exc: BlizzardError, refusals: int) -> None:
        """The first refusal in a row is a warning; the next ones are only debug detail."""
        level = logging.WARNING if refusals == 1 else logging.DEBUG
        log.log(level, "leasing from %s failed: %s (%s); trying again, backing off",
                queue, exc, type(exc).__name__)

    async def _pause(self, seconds: float) -> None:
        """Sleep, unless the dispatcher is stopped meanwhile."""
        try:
            await asyncio.wait_for(self.stopping.wait(), seconds)
        except TimeoutError:
            pass

    def _admit(self, msg: Message, deadline: float) -> None:
        """A leased message into the line, or straight to burial if it must not be sent;
        held (its lease kept alive until it is settled) until ``deadline`` unless extended."""
        self.totals["leased"] += 1
        try:
            task, problem = HttpTask.decode(msg.data), ""
        except InvalidArgument as exc:
            task, problem = None, exc.message
        delivery = Delivery(msg, task)
        self.held[delivery.key] = delivery
        self._settler().hold(delivery, deadline)
        if task is None:
            self._fail(delivery, problem, final=True)
        elif refusal := self.hosts.refusal(task.url):
            self._fail(delivery, refusal, final=True)
        elif msg.attempts >= task.max_attempts:  # earlier deliveries' leases ran out
            self._fail(delivery, f"{msg.attempts} deliveries without success; last: "
                                 f"{msg.error or 'none recorded'}", final=True)
        else:
            self.line.put_nowait(delivery)

    # -- sending -----------------------------------------------------------------------------

    async def _sender(self, session: aiohttp.ClientSession) -> None:
        while (delivery := await self.line.get()) is not None:
            ok, error = await self._send(session, delivery)
            if ok:
                self.totals["succeeded"] += 1
                self._settler().ack(delivery)
            else:
                self._fail(delivery, error)
            self.room.set()

    async def _send(self, session: aiohttp.ClientSession, delivery: Delivery) -> tuple[bool, str]:
        """Make the task's request: (True, "") on a 2xx reply, else (False, what went wrong)."""
        task, msg = delivery.task, delivery.msg
        assert task is not None
        headers = [*task.headers, (TASK_HEADER, str(msg.id)),
                   (ATTEMPT_HEADER, str(msg.attempts + 1))]
        try:
            async with session.request(task.method, task.url, headers=headers,
                                       data=task.body or None, allow_redirects=False,
                                       timeout=aiohttp.ClientTimeout(total=task.timeout_s)) as r:
                if 200 <= r.status < 300:
                    await _drain(r)
                    return True, ""
                body = await r.content.read(ERROR_BODY_BYTES)
                text = body.decode(errors="replace").strip()
                status = f"HTTP {r.status} {r.reason or ''}".strip()
                return False, f"{status}: {text}" if text else status
        except TimeoutError:
            return False, f"no reply within {task.timeout_s:g} s"
        except aiohttp.ClientError as exc:
            return False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        except Exception as exc:  # a bug in one request must not stop a sender
            log.exception("sending task %d failed", msg.id)
            return False, f"{type(exc).__name__}: {exc}"

    def _fail(self, delivery: Delivery, error: str, final: bool = False) -> None:
        """A failed attempt: nack it to come back after the back-off, or (its attempts spent,
        or ``final``: it must not be sent) bury it in the dead-letter queue."""
        msg, task = delivery.msg, delivery.task
        if task is not None:
            attempt = msg.attempts + 1
            error = f"attempt {attempt}/{task.max_attempts}: {error}"
            final = final or attempt >= task.max_attempts
        if task is None or final:
            self.totals["dead"] += 1
            self._settler().bury(delivery, error)
        else:
            self.totals["retried"] += 1
            self._settler().nack(delivery, task.backoff_s, error)

    def _settler(self) -> Settler:
        assert self.settler is not None, "run() makes the settler"
        return self.settler


async def _drain(reply: aiohttp.ClientResponse) -> None:
    """Read a reply's body (up to ``DRAIN_BYTES``) so its connection can serve the next one."""
    read = 0
    async for chunk in reply.content.iter_chunked(64 * 1024):
        read += len(chunk)
        if read > DRAIN_BYTES:
            break


def _lease(client: BlizzardClient, queue: str, n: int, lease_s: float,
           wait_s: float) -> list[Message]:
    """Lease up to ``n`` of ``queue``'s items with ``client`` (in the client's thread)."""
    return client.dequeue_many(queue, n, lease_s=lease_s, wait_s=wait_s)
