"""An in-memory stand-in for the master, for in-process tests of the dispatcher's loops.

``FakeMaster.client`` is what ``Dispatcher(make_client=...)`` calls: each client leases from
one line of items, and settles (ack, nack, bury, extend) leases the master keeps with their
expiry, so a test can see a lease that ran out before it was settled (``lost``). Each settle
call can be made to take time (``settle_s``, as a master's fsync does), and lease or extend
calls to raise (``lease_errors``, ``extend_error``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from blizzard.client.message import Message
from blizzard.wire import protocol as p
from blizzard.wire.errors import LeaseExpired

Key = tuple[int, int]  # (item id, lease token)


class FakeMaster:
    """Items waiting, leases held (with expiry), and every settle call made."""

    def __init__(self, settle_s: float = 0.0) -> None:
        self.settle_s = settle_s
        self.lock = threading.Lock()
        self.ready: deque[tuple[int, bytes, int]] = deque()  # (id, data, attempts)
        self.expiry: dict[Key, float] = {}  # held leases -> time.monotonic() they end
        self.tokens = 0
        self.calls: list[tuple[str, list[Key]]] = []  # (op, keys) in order
        self.nacks: list[tuple[float, str]] = []  # each nack call's (delay_s, error)
        self.lost: list[tuple[str, Key]] = []  # settled after its lease ran out
        self.lease_errors: list[Exception] = []  # raised by the next leases, in order
        self.extend_error: Exception | None = None
        self.leased = 0
        self.most_held = 0  # the most leases held at once

    def add(self, item_id: int, data: bytes, attempts: int = 0) -> None:
        with self.lock:
            self.ready.append((item_id, data, attempts))

    def client(self) -> FakeClient:
        return FakeClient(self)

    def expire(self, item_id: int, data: bytes) -> None:
        """End the item's leases now, as the master's timer would, and put it back in line."""
        with self.lock:
            for key in [k for k in self.expiry if k[0] == item_id]:
                del self.expiry[key]
            self.ready.appendleft((item_id, data, 1))

    def settled(self, op: str) -> list[Key]:
        with self.lock:
            return [key for name, keys in self.calls if name == op for key in keys]

    def lease(self, n: int, lease_s: float) -> list[Message]:
        with self.lock:
            if self.lease_errors:
                raise self.lease_errors.pop(0)
            msgs = []
            while self.ready and len(msgs) < n:
                item_id, data, attempts = self.ready.popleft()
                self.tokens += 1
                self.expiry[(item_id, self.tokens)] = time.monotonic() + lease_s
                msgs.append(Message(item_id, data, "q", attempts, 0, 0.0, self.tokens, None))
            self.leased += len(msgs)
            self.most_held = max(self.most_held, len(self.expiry))
            return msgs

    def settle(self, op: str, msgs: Sequence[Any], lease_s: float = 0.0) -> list[int]:
        """Apply one settle call after ``settle_s``; the ids whose lease was not held."""
        time.sleep(self.settle_s)
        with self.lock:
            keys = [(m.id, m.lease) for m in msgs]
            self.calls.append((op, keys))
            now, lost = time.monotonic(), []
            for key in keys:
                if self.expiry.get(key, 0.0) < now:
                    self.expiry.pop(key, None)
                    self.lost.append((op, key))
                    lost.append(key[0])
                elif op == "extend":
                    self.expiry[key] = now + lease_s
                else:
                    del self.expiry[key]
            return lost


class FakeClient:
    """The part of ``blizzard.Client`` the dispatcher uses, on a ``FakeMaster``."""

    def __init__(self, fake: FakeMaster) -> None:
        self.fake = fake
        self.master = self  # ``http_delivery.bury`` calls ``client.master.call(p.Bury(...))``

    def dequeue_many(self, queue: str, n: int, *, lease_s: float, wait_s: float) -> list[Message]:
        msgs = self.fake.lease(n, lease_s)
        if not msgs:
            time.sleep(min(wait_s, 0.02))  # a short long poll: the line is empty
        return msgs

    def ack_many(self, msgs: Sequence[Any]) -> None:
        self._check(self.fake.settle("ack", msgs))

    def nack_many(self, msgs: Sequence[Any], *, delay_s: float | None = None,
                  error: str = "") -> None:
        self.fake.nacks.append((delay_s or 0.0, error))
        self._check(self.fake.settle("nack", msgs))

    def extend_many(self, msgs: Sequence[Any], *, lease_s: float) -> None:
        if self.fake.extend_error is not None:
            raise self.fake.extend_error
        self._check(self.fake.settle("extend", msgs, lease_s))

    def call(self, request: Any) -> p.Acked:
        assert isinstance(request, p.Bury)
        msgs = [Message(i, b"", "q", 0, 0, 0.0, lease, None)
                for i, lease in zip(request.ids, request.leases, strict=True)]
        lost = self.fake.settle("bury", msgs)
        return p.Acked(len(msgs) - len(lost), lost)

    def close(self) -> None:
        pass

    @staticmethod
    def _check(lost: list[int]) -> None:
        if lost:
            raise LeaseExpired(f"items {lost[:10]} are no longer leased")
