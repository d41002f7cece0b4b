"""The dispatcher's settling: outcomes to the master in batches, leases kept alive until then.

A task leased by ``blizzard dispatch`` is held, by (id, lease token), from its lease until the
master has its outcome: while it waits in line, while its request is out, and while its
outcome waits to be sent. All that time its lease is kept alive by the client's lease keeper
(``blizzard/client/lease_keeper.py``, the worker's too): extended when a third of it is left,
an unanswered extension tried again soon; a lease left to run out would let the master hand
the task out again while this one is still deciding it. The same item leased twice (its first lease
ran out) is two deliveries, held apart by their tokens.

Outcomes are sent in batches, one call per kind: the acks together, the nacks grouped by
back-off and error text (one ``Nack`` carries one of each), the burials by error. So an
endpoint failing fast costs the master one fsync per group, not one per task.

``blizzard.Client`` blocks and is not thread-safe, so each runs in a thread of its own
(``ClientThread``); settling and extending share one, in turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from blizzard.client.api import BlizzardClient
from blizzard.client.http_delivery import HttpTask, bury
from blizzard.client.lease_keeper import EXTEND_AT, Extended, Held, LeaseKeeper, extension
from blizzard.client.message import Message
from blizzard.wire import protocol as p
from blizzard.wire.errors import BlizzardError

log = logging.getLogger(__name__)

Key = tuple[int, int]  # (item id, lease token): one delivery of an item


@dataclass(slots=True)
class Delivery:
    """A leased item on its way: the message (id, lease token, attempts) and its task."""

    msg: Message
    task: HttpTask | None  # None: the payload is not a task

    @property
    def key(self) -> Key:
        return self.msg.id, self.msg.lease


class ClientThread:
    """A ``Client`` made and used in one thread of its own, called from the event loop."""

    def __init__(self, make_client: Callable[[], BlizzardClient], name: str) -> None:
        self.executor = ThreadPoolExecutor(1, thread_name_prefix=name)
        self.make_client = make_client
        self.client: BlizzardClient | None = None

    async def call(self, fn: Callable[[BlizzardClient], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, self._run, fn)

    def _run(self, fn: Callable[[BlizzardClient], Any]) -> Any:
        if self.client is None:
            self.client = self.make_client()
        return fn(self.client)

    def close(self, wait: bool) -> None:
        """Close the client in its thread (its acks made durable); ``wait=False`` if it is stuck."""
        if wait and self.client is not None:
            self.executor.submit(self.client.close).result()
        self.executor.shutdown(wait=wait, cancel_futures=True)


@dataclass
class Outcomes:
    """Decided deliveries waiting to be sent, grouped as the master takes them."""

    acks: list[Delivery] = field(default_factory=list)
    nacks: defaultdict[tuple[float, str], list[Delivery]] = field(
        default_factory=lambda: defaultdict(list))  # (delay_s, error) -> deliveries
    burials: defaultdict[str, list[Delivery]] = field(
        default_factory=lambda: defaultdict(list))  # error -> deliveries

    def __bool__(self) -> bool:
        return bool(self.acks or self.nacks or self.burials)

    def deliveries(self) -> list[Delivery]:
        return [*self.acks, *(d for ds in self.nacks.values() for d in ds),
                *(d for ds in self.burials.values() for d in ds)]

    def send(self, client: BlizzardClient) -> int:
        """Settle every outcome on ``client`` (in its thread); returns the calls that failed.

        A failed call's tasks come back when their leases run out (``LeaseExpired``: the
        master settled the rest of the call; its lease had run out already).
        """
        failed = 0
        for what, settle in self._calls(client):
            try:
                settle()
            except BlizzardError as exc:
                failed += 1
                log.warning("settling %s failed: %s (%s)", what, exc, type(exc).__name__)
        return failed

    def _calls(self, client: BlizzardClient) -> list[tuple[str, Callable[[], None]]]:
        calls: list[tuple[str, Callable[[], None]]] = []
        # each call binds its own messages (a closure would see the loop's last ones)
        if self.acks:
            acks = [d.msg for d in self.acks]
            calls.append((f"{len(acks)} acks", lambda: client.ack_many(acks)))
        for (delay_s, error), group in self.nacks.items():
            calls.append((f"{len(group)} nacks", partial(client.nack_many, [d.msg for d in group],
                                                         delay_s=delay_s, error=error)))
        for error, group in self.burials.items():
            for start in range(0, len(group), p.MAX_BATCH):
                part = [d.msg for d in group[start:start + p.MAX_BATCH]]
                calls.append((f"{len(part)} burials", partial(bury, client, part, error)))
        return calls


class Settler:
    """Sends outcomes as they come and extends the leases of what is held, in one thread.

    ``held`` is the dispatcher's: deliveries leased and not yet settled; the dispatcher tells
    the settler of each (``hold``), whose lease it keeps (``keeper``) until it drops the
    delivery, once its outcome is sent, and calls ``on_settled`` (there is room to lease
    more). ``unsettled`` counts the held deliveries already decided.
    """

    def __init__(self, thread: ClientThread, held: dict[Key, Delivery], lease_s: float,
                 on_settled: Callable[[], None]) -> None:
        self.thread = thread
        self.held = held
        self.lease_s = lease_s
        self.on_settled = on_settled
        self.keeper = LeaseKeeper()
        self.leases: dict[Key, Held] = {}  # the lease of each delivery of ``held``
        self.pending = Outcomes()
        self.unsettled = 0  # outcomes pending or being sent
        self.failures = 0  # settle calls that failed
        self._wake = asyncio.Event()
        self._finishing = False

    def hold(self, delivery: Delivery, deadline: float) -> None:
        """A delivery newly held, its lease ending at ``deadline`` (monotonic) unless extended."""
        lease = self.leases[delivery.key] = Held(delivery.msg, self.lease_s, deadline)
        self.keeper.hold(lease)

    def ack(self, delivery: Delivery) -> None:
        self.pending.acks.append(delivery)
        self._added()

    def nack(self, delivery: Delivery, delay_s: float, error: str) -> None:
        self.pending.nacks[(delay_s, error)].append(delivery)
        self._added()

    def bury(self, delivery: Delivery, error: str) -> None:
        self.pending.burials[error].append(delivery)
        self._added()

    def _added(self) -> None:
        self.unsettled += 1
        self._wake.set()

    def finish(self) -> None:
        """Every outcome is decided: send what is pending, then ``run`` returns."""
        self._finishing = True
        self._wake.set()

    async def run(self) -> None:
        """Settle outcomes as they come; extend the leases held as they fall due."""
        look_s = self.lease_s * EXTEND_AT / 2  # a lease held meanwhile is not due sooner
        while True:
            if not self.pending:
                now = time.monotonic()
                try:
                    await asyncio.wait_for(self._wake.wait(),
                                           max(0.0, min(self.keeper.next_at - now, look_s)))
                except TimeoutError:
                    pass
            self._wake.clear()
            if self.pending:
                await self._settle()
            if time.monotonic() >= self.keeper.next_at:
                await self._extend()
            if self._finishing and not self.pending:
                return

    async def _settle(self) -> None:
        batch, self.pending = self.pending, Outcomes()
        self.failures += await self.thread.call(batch.send)
        settled = batch.deliveries()
        for delivery in settled:
            self.held.pop(delivery.key, None)
            self.leases.pop(delivery.key, None)
        self.unsettled -= len(settled)
        self.on_settled()

    async def _extend(self) -> None:
        """Extend the leases due (``keeper``), in the client's thread; the keeper takes the
        answers here, in the event loop's."""
        now = time.monotonic()
        for lease_s, group in self.keeper.due(self.leases.values(), now).items():
            try:  # in the client's thread; awaited before the loop goes on to the next group
                answer = await self.thread.call(partial(_extend, group=group, lease_s=lease_s))
            except BlizzardError as exc:  # refused: they keep their deadlines and are tried again
                log.warning("extending %d leases: %s (%s)", len(group), exc, type(exc).__name__)
                answer = Extended.UNANSWERED
            self.keeper.take(group, lease_s, now, answer)


def _extend(client: BlizzardClient, group: list[Held], lease_s: float) -> Extended:
    """Extend ``group``'s leases by ``lease_s`` with ``client`` (in the client's thread)."""
    return extension(lambda msgs, s: client.extend_many(msgs, lease_s=s), group, lease_s)
