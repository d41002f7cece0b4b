"""Group commit for a gateway's connections: the puts (and the deletes) many connections make at
once go to the cluster together, so one enqueue carries several connections' jobs and one ack
several deletes.

Each kind has a thread with a client of its own. A connection hands its request over and
waits; the thread sends what is waiting as one call (items of one tube with the same options
in one enqueue), answers each waiter, and takes what gathered meanwhile. A lone request goes
out at once: nothing waits for company, so one connection sees no added latency. Each
waiter's answer is its own: its id, or the error its item (or its batch) met.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from blizzard.client.enqueue_options import EnqueueOptions
from blizzard.client.leases import refusal
from blizzard.wire import protocol as p
from blizzard.wire.codec import as_ids

log = logging.getLogger(__name__)

MAX_BATCH = 1000  # requests one call carries at most
WAIT_S = 120.0  # a waiter's longest wait (the client's own timeout ends a call well before)


@dataclass(eq=False)
class _Request:
    group: tuple[Any, ...]  # requests of one group share a call
    what: Any  # a put's payload, or an ack's (id, lease)
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None

    def answer(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()


class _Lane:
    """One kind of request, its waiting list and the thread that sends it."""

    def __init__(self, name: str, client: Any, send: Callable[[Any, tuple[Any, ...],
                                                                list[_Request]], None]) -> None:
        self.client = client
        self.send = send
        self.cond = threading.Condition()
        self.waiting: list[_Request] = []
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name=f"gateway-{name}", daemon=True)
        self.thread.start()

    def submit(self, group: tuple[Any, ...], what: Any) -> Any:
        req = _Request(group, what)
        with self.cond:
            if self.stopping:
                raise RuntimeError("the gateway is stopping")
            self.waiting.append(req)
            self.cond.notify()
        if not req.done.wait(WAIT_S):
            raise TimeoutError("the cluster did not answer in time")
        if req.error is not None:
            raise req.error
        return req.result

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.waiting and not self.stopping:
                    self.cond.wait()
                if self.stopping and not self.waiting:
                    return
                taken, self.waiting = self.waiting[:MAX_BATCH], self.waiting[MAX_BATCH:]
            groups: dict[tuple[Any, ...], list[_Request]] = {}
            for req in taken:
                groups.setdefault(req.group, []).append(req)
            for group, reqs in groups.items():
                try:
                    self.send(self.client, group, reqs)
                except BaseException as exc:  # the whole call failed: each waiter hears why
                    for req in reqs:
                        if not req.done.is_set():
                            req.answer(error=exc)

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join(10)
        self.client.close()


def _send_puts(client: Any, group: tuple[Any, ...], reqs: list[_Request]) -> None:
    tube, opts = group
    ids = client.pipeline.enqueue(tube, [r.what for r in reqs], opts)
    for req, item_id in zip(reqs, ids, strict=True):
        req.answer(item_id)


def _send_acks(client: Any, group: tuple[Any, ...], reqs: list[_Request]) -> None:
    """The acks in calls that name each id once (the master settles an id named twice by
    its first token only: another connection's stale token must not refuse a valid one)."""
    queue, late = group
    while reqs:
        seen: set[int] = set()
        now: list[_Request] = []
        later: list[_Request] = []
        for req in reqs:
            (later if req.what[0] in seen else now).append(req)
            seen.add(req.what[0])
        reply: p.Acked = client.master.call(p.Ack(as_ids([r.what[0] for r in now]),
                                                  [r.what[1] for r in now], False, queue, late))
        why = dict(zip(reply.lost, reply.why or [p.LOST_EXPIRED] * len(reply.lost), strict=True))
        for req in now:
            item_id = req.what[0]
            req.answer(error=refusal([item_id], [why[item_id]], queue) if item_id in why
                       else None)
        reqs = later


class Batcher:
    """Puts and deletes of all a gateway's connections, each kind sent in batches."""

    def __init__(self, client_factory: Callable[[], Any]) -> None:
        self.puts = _Lane("puts", client_factory(), _send_puts)
        self.acks = _Lane("acks", client_factory(), _send_acks)

    def put(self, tube: str, body: bytes, opts: EnqueueOptions) -> int:
        """Enqueue ``body`` to ``tube`` with ``opts``; its id once committed."""
        item_id: int = self.puts.submit((tube, opts), body)
        return item_id

    def ack(self, queue: str, item_id: int, lease: int, late: bool = False) -> None:
        """Ack, durable on return; ``LeaseExpired`` (or the like) if it was refused
        (``late``: see ``Ack.late``)."""
        self.acks.submit((queue, late), (item_id, lease))

    def stop(self) -> None:
        self.puts.stop()
        self.acks.stop()
