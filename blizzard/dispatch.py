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
(acks, nacks, burials, lease extensions). While a task is leased its lease is extended every
third of ``lease_s``, so a slow endpoint does not cost it; a dispatcher killed mid-request
loses nothing: its leases run out and the tasks come back (at least once, not exactly once).

The rate limit is the master's: a queue's token bucket admits new tasks, and retries pass
without a token (``master/admission.py``), so a retry keeps the back-off it asked for.
Per-queue rates give one queue priority over another.

``stop()`` (SIGTERM): no more leases; the tasks leased already are sent and settled, then the
clients close. ``stop(hard=True)`` abandons requests in flight (their leases run out).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import aiohttp

from blizzard.client import Client
from blizzard.errors import BlizzardError, ClusterError, InvalidArgument
from blizzard.http_task import ATTEMPT_HEADER, TASK_HEADER, Task, bury
from blizzard.message import Message
from blizzard.queue_settings import check_queue_name

log = logging.getLogger(__name__)

ERROR_BODY_BYTES = 200  # of a failed reply's body, kept in the error text
DRAIN_BYTES = 1024 * 1024  # of a reply's body read so its connection can be reused
RETRY_PAUSE_S = 1.0  # after a lease failed (master or data nodes unavailable)


@dataclass(frozen=True)
class DispatchConfig:
    """How a dispatcher runs; the defaults are ``blizzard dispatch``'s."""

    master: str
    queues: tuple[str, ...]
    workers: int = 16  # requests in flight at once
    lease_s: float = 30.0  # extended every third of it while a task is leased
    batch: int = 100  # tasks leased at once per queue, at most
    wait_s: float = 1.0  # a lease's long poll on an empty queue
    timeout_s: float = 30.0  # the client's: master requests are retried this long
    keys: str | None = None  # a key directory; None: BLIZZARD_KEYS

    def validate(self) -> "DispatchConfig":
        if not self.queues:
            raise InvalidArgument("name at least one queue to dispatch from")
        for queue in self.queues:
            check_queue_name(queue)
        if not 1 <= self.workers <= 10_000 or not 1 <= self.batch <= 10_000:
            raise InvalidArgument("workers and batch must be 1..10000")
        if not 1.0 <= self.lease_s <= 43200 or not 0 <= self.wait_s <= 300:
            raise InvalidArgument("lease_s must be 1..43200 s and wait_s 0..300 s")
        return self


@dataclass(slots=True)
class Delivery:
    """A leased item on its way: the message (id, lease token, attempts) and its task."""

    msg: Message
    task: Task | None  # None: the payload is not a task (``problem`` says why)
    problem: str = ""


@dataclass
class Settling:
    """Outcomes waiting for the settle thread: acks go in batches, the rest one by one."""

    acks: list[Message] = field(default_factory=list)
    nacks: list[tuple[Message, float, str]] = field(default_factory=list)
    burials: list[tuple[Message, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.acks or self.nacks or self.burials)


class ClientThread:
    """A ``Client`` made and used in one thread of its own, called from the event loop."""

    def __init__(self, make_client: Callable[[], Client], name: str) -> None:
        self.executor = ThreadPoolExecutor(1, thread_name_prefix=name)
        self.make_client = make_client
        self.client: Client | None = None

    async def call(self, fn: Callable[[Client], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, self._run, fn)

    def _run(self, fn: Callable[[Client], Any]) -> Any:
        if self.client is None:
            self.client = self.make_client()
        return fn(self.client)

    def close(self, wait: bool) -> None:
        """Close the client in its thread (its acks made durable); ``wait=False`` if it is stuck."""
        if wait and self.client is not None:
            self.executor.submit(self.client.close).result()
        self.executor.shutdown(wait=wait, cancel_futures=True)


class Dispatcher:
    """Leases tasks from ``config.queues``, sends them, settles them; ``run`` until ``stop``."""

    def __init__(self, config: DispatchConfig,
                 make_client: Callable[[], Client] | None = None) -> None:
        self.config = config.validate()
        self.make_client = make_client or (lambda: Client(config.master,
                                                          timeout_s=config.timeout_s,
                                                          keys=config.keys))
        self.totals: Counter[str] = Counter()  # leased, succeeded, retried, dead, settle_failures
        self.leased: dict[int, Delivery] = {}  # leased and not yet decided
        self.settling = Settling()
        self.line: asyncio.Queue[Delivery | None] = asyncio.Queue()
        self.room = asyncio.Event()  # a task was decided: there may be room to lease more
        self.outcomes = asyncio.Event()  # outcomes wait for the settle thread
        self._stopping = False  # no more leases
        self._senders_done = False  # every outcome is decided: the settler may finish
        self._tasks: list[asyncio.Task] = []  # lease loops and senders (a hard stop cancels them)
        self.failure: BlizzardError | None = None  # what stopped the dispatcher, if not ``stop``

    async def run(self) -> Counter[str]:
        """Dispatch until ``stop``; returns the totals. A lease the cluster refuses for good
        (a key it does not admit, say) stops the dispatcher cleanly and is raised."""
        settle = ClientThread(self.make_client, "settle")
        leasers = {q: ClientThread(self.make_client, f"lease-{q}") for q in self.config.queues}
        connector = aiohttp.TCPConnector(limit=self.config.workers)
        async with aiohttp.ClientSession(connector=connector) as session:
            senders = [asyncio.create_task(self._sender(session))
                       for _ in range(self.config.workers)]
            loops = [asyncio.create_task(self._lease_loop(q, t)) for q, t in leasers.items()]
            self._tasks = loops + senders
            settler = asyncio.create_task(self._settle_loop(settle))
            keeper = asyncio.create_task(self._keep_alive(settle))
            ended = await asyncio.gather(*loops, return_exceptions=True)
            for _ in senders:
                self.line.put_nowait(None)  # each sender stops after the tasks before it
            ended += await asyncio.gather(*senders, return_exceptions=True)
            hard = any(isinstance(e, asyncio.CancelledError) for e in ended)
            keeper.cancel()
            self._senders_done = True
            self.outcomes.set()
            await settler
        for thread in leasers.values():
            thread.close(wait=not hard)
        settle.close(wait=True)
        log.info("dispatcher stopped: %s", dict(self.totals))
        if self.failure is not None:
            raise self.failure
        return self.totals

    def stop(self, hard: bool = False) -> None:
        """Lease no more; finish what is leased (``hard``: abandon requests in flight)."""
        self._stopping = True
        self.room.set()
        if hard:
            for task in self._tasks:
                task.cancel()

    # -- leasing -----------------------------------------------------------------------------

    async def _lease_loop(self, queue: str, thread: ClientThread) -> None:
        """Keep the senders fed, while not stopping: lease once no more than a round of work
        (``workers`` tasks) is held, up to two rounds.

        So leases come in batches, not one per finished request, and a second round waits in
        line while the first is sent (its leases kept alive meanwhile). Each queue asks for
        the room there is when it asks, so with several queues more may be held for a while.
        """
        cfg = self.config
        while not self._stopping:
            held = len(self.leased)
            if held > cfg.workers:
                self.room.clear()
                await self.room.wait()
                continue
            n = min(2 * cfg.workers - held, cfg.batch)
            try:
                msgs = await thread.call(lambda c: c.dequeue_many(
                    queue, n, lease_s=cfg.lease_s, wait_s=cfg.wait_s))
            except ClusterError as exc:  # the master restarting, data nodes down: it passes
                log.warning("leasing from %s failed: %s (%s); trying again", queue, exc,
                            type(exc).__name__)
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            except BlizzardError as exc:  # refused (keys, arguments): asking again will not help
                self.failure = self.failure or exc
                self.stop()
                return
            for msg in msgs:
                self._admit(msg)

    def _admit(self, msg: Message) -> None:
        """A leased message into the line, or straight to burial if it cannot be sent."""
        self.totals["leased"] += 1
        try:
            delivery = Delivery(msg, Task.decode(msg.data))
        except InvalidArgument as exc:
            delivery = Delivery(msg, None, exc.message)
        self.leased[msg.id] = delivery
        task = delivery.task
        if task is None:
            self._decide(delivery, False, delivery.problem)
        elif msg.attempts >= task.max_attempts:  # earlier deliveries' leases ran out
            self._decide(delivery, False, f"{msg.attempts} deliveries without success; last: "
                                          f"{msg.error or 'none recorded'}")
        else:
            self.line.put_nowait(delivery)

    # -- sending -----------------------------------------------------------------------------

    async def _sender(self, session: aiohttp.ClientSession) -> None:
        while (delivery := await self.line.get()) is not None:
            ok, error = await self._send(session, delivery)
            self._decide(delivery, ok, error)

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

    def _decide(self, delivery: Delivery, ok: bool, error: str) -> None:
        """Hand the outcome to the settler: ack, nack after the back-off, or bury."""
        msg, task = delivery.msg, delivery.task
        self.leased.pop(msg.id, None)
        self.room.set()
        if ok:
            self.totals["succeeded"] += 1
            self.settling.acks.append(msg)
        else:
            attempt = msg.attempts + 1
            if task is not None:
                error = f"attempt {attempt}/{task.max_attempts}: {error}"
            if task is None or attempt >= task.max_attempts:
                self.totals["dead"] += 1
                self.settling.burials.append((msg, error))
            else:
                self.totals["retried"] += 1
                self.settling.nacks.append((msg, task.backoff_s if task else 0.0, error))
        self.outcomes.set()

    # -- settling ----------------------------------------------------------------------------

    async def _settle_loop(self, thread: ClientThread) -> None:
        """Send outcomes as they come, acks batched; after the senders stop, the rest."""
        while True:
            await self.outcomes.wait()
            self.outcomes.clear()
            batch, self.settling = self.settling, Settling()
            if batch:
                await self._settle(thread, batch)
            if self._senders_done and not self.settling:
                return

    async def _settle(self, thread: ClientThread, batch: Settling) -> None:
        def send(c: Client) -> int:
            lost = 0
            calls: list[Callable[[], None]] = []
            if batch.acks:
                calls.append(lambda: c.ack_many(batch.acks))
            for msg, delay_s, error in batch.nacks:
                calls.append(lambda m=msg, d=delay_s, e=error: c.nack_many([m], delay_s=d, error=e))
            for msg, error in batch.burials:
                calls.append(lambda m=msg, e=error: bury(c, [m], e))
            for settle in calls:
                try:
                    settle()
                except BlizzardError as exc:  # the item comes back when its lease runs out
                    lost += 1
                    log.warning("settling failed: %s (%s)", exc, type(exc).__name__)
            return lost
        self.totals["settle_failures"] += await thread.call(send)

    async def _keep_alive(self, thread: ClientThread) -> None:
        """Extend the leases of tasks not yet decided, every third of ``lease_s``."""
        lease_s = self.config.lease_s
        while True:
            await asyncio.sleep(lease_s / 3)
            msgs = [d.msg for d in self.leased.values()]
            if not msgs:
                continue
            try:
                await thread.call(lambda c: c.extend_many(msgs, lease_s=lease_s))
            except BlizzardError as exc:
                log.warning("extending %d leases: %s (%s)", len(msgs), exc, type(exc).__name__)


async def _drain(reply: aiohttp.ClientResponse) -> None:
    """Read a reply's body (up to ``DRAIN_BYTES``) so its connection can serve the next one."""
    read = 0
    async for chunk in reply.content.iter_chunked(64 * 1024):
        read += len(chunk)
        if read > DRAIN_BYTES:
            break
