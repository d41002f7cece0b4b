"""An HTTP task: an item whose data says where it goes and how hard to try (the c12s task queue).

A task is a queue item like any other; its payload is a msgpack map (``HttpTask.encode``) naming
the request to make (URL, method, headers, body) and the task's own retry policy: how many
deliveries at most (``max_attempts``), how long to wait between them (``backoff_s``) and how
long to wait for a reply (``timeout_s``). ``blizzard dispatch`` (``blizzard/dispatch/deliver.py``)
sends it and counts a 2xx reply as done.

Not an ``@task`` call (``blizzard/worker/task.py``, run by ``blizzard worker``): hence the
class's name, ``HttpTask``. Everything is checked when the task is made, before anything is
sent, so a bad task is refused at ``enqueue_task`` with ``InvalidArgument`` naming the field,
not found dead later. Also here: what ``blizzard task ID`` and ``queue stats --tasks`` ask the
master.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument, LeaseExpired, ProtocolError
from blizzard.wire.queue_settings import check_queue_name
from blizzard.wire.shard_messages import shard_of

FORMAT = 1  # the payload's "task" field: a later layout can still read this one
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
MAX_URL = 8192  # characters
MAX_HEADERS = 100
MAX_HEADER_BYTES = 8192  # one header's name and value together
MAX_BODY_BYTES = 4 * 1024 * 1024  # leaves room under the default item limit (8 MiB)
MAX_ATTEMPTS = 1000
MAX_BACKOFF_S = 86400.0
MAX_TIMEOUT_S = 3600.0
# The dispatcher names each request's task and attempt, so an endpoint can tell a repeat
# (delivery is at least once).
TASK_HEADER, ATTEMPT_HEADER = "X-Blizzard-Task", "X-Blizzard-Attempt"
# set by the HTTP client or the dispatcher; a task naming them would contradict it
CLIENT_HEADERS = frozenset({"content-length", "transfer-encoding", "host", "connection",
                            TASK_HEADER.lower(), ATTEMPT_HEADER.lower()})
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110 header name
_SPACE = re.compile(r"\s")


@dataclass(frozen=True)
class HttpTask:
    """One HTTP request to make, and the policy for retrying it. Build with ``HttpTask.make``."""

    url: str
    method: str = "POST"
    headers: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    body: bytes = b""
    max_attempts: int = 5
    backoff_s: float = 2.0
    timeout_s: float = 10.0

    @classmethod
    def make(cls, url: str, *, method: str = "POST", headers: Mapping[str, str] | None = None,
             body: bytes | str = b"", max_attempts: int = 5, backoff_s: float = 2.0,
             timeout_s: float = 10.0) -> HttpTask:
        """A checked task; ``InvalidArgument`` names the first field that is wrong."""
        if isinstance(body, str):
            body = body.encode()
        if not isinstance(headers, Mapping) and headers is not None:
            raise InvalidArgument("headers must be a mapping of names to values")
        pairs = tuple((headers or {}).items())
        return cls(url, method.upper() if isinstance(method, str) else method, pairs, body,
                   max_attempts, backoff_s, timeout_s).check()

    def check(self) -> HttpTask:
        """This task, if every field is within its rules; else ``InvalidArgument``."""
        _check_url(self.url)
        if self.method not in METHODS:
            raise InvalidArgument(f"method {self.method!r} is not one of {', '.join(METHODS)}")
        _check_headers(self.headers)
        if not isinstance(self.body, bytes):
            raise InvalidArgument("body must be bytes or str")
        if len(self.body) > MAX_BODY_BYTES:
            raise InvalidArgument(f"body is {len(self.body)} bytes; at most {MAX_BODY_BYTES}")
        if type(self.max_attempts) is not int or not 1 <= self.max_attempts <= MAX_ATTEMPTS:
            raise InvalidArgument(f"max_attempts must be an integer 1..{MAX_ATTEMPTS}, "
                                  f"got {self.max_attempts!r}")
        _check_seconds("backoff_s", self.backoff_s, 0.0, MAX_BACKOFF_S, zero_ok=True)
        _check_seconds("timeout_s", self.timeout_s, 0.0, MAX_TIMEOUT_S, zero_ok=False)
        return self

    def encode(self) -> bytes:
        """The item payload: a msgpack map, fields by name."""
        return p.dumps({"task": FORMAT, "url": self.url, "method": self.method,
                        "headers": [list(h) for h in self.headers], "body": self.body,
                        "max_attempts": self.max_attempts, "backoff_s": float(self.backoff_s),
                        "timeout_s": float(self.timeout_s)})

    @classmethod
    def decode(cls, data: bytes) -> HttpTask:
        """The task in an item's payload; ``InvalidArgument`` if the payload is not one."""
        try:
            doc = p.loads(data)
        except ProtocolError as exc:
            raise InvalidArgument(f"the item is not a task: {exc.message}") from None
        if not isinstance(doc, dict) or doc.get("task") != FORMAT:
            raise InvalidArgument(f"the item is not a task (format {FORMAT} expected)")
        try:
            headers = tuple((name, value) for name, value in doc.get("headers", []))
            return cls(doc["url"], doc["method"], headers, doc.get("body", b""),
                       doc["max_attempts"], doc["backoff_s"], doc["timeout_s"]).check()
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgument(f"the item is not a well-formed task: {exc!r}"[:300]) from None


def _check_url(url: Any) -> None:
    if not isinstance(url, str) or not url:
        raise InvalidArgument("url must be a non-empty string")
    if len(url) > MAX_URL:
        raise InvalidArgument(f"url is {len(url)} characters; at most {MAX_URL}")
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError on a port that is not a number in range
    except ValueError as exc:
        raise InvalidArgument(f"url {url[:80]!r} does not parse: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgument(f"url {url[:80]!r} must be http:// or https:// with a host")
    if port == 0 or not url.isprintable() or _SPACE.search(url):
        raise InvalidArgument(f"url {url[:80]!r} has port 0, spaces or control characters")


def _check_headers(headers: Any) -> None:
    if len(headers) > MAX_HEADERS:
        raise InvalidArgument(f"{len(headers)} headers; at most {MAX_HEADERS}")
    for name, value in headers:
        if not isinstance(name, str) or not _TOKEN.match(name):
            raise InvalidArgument(f"header name {str(name)[:60]!r} is not a valid HTTP token")
        if name.lower() in CLIENT_HEADERS:
            raise InvalidArgument(f"header {name} is set by the dispatcher's HTTP client")
        if not isinstance(value, str) or "\r" in value or "\n" in value or "\0" in value:
            raise InvalidArgument(f"header {name}: the value must be a string without CR, LF "
                                  "or NUL")
        if len(name) + len(value.encode()) > MAX_HEADER_BYTES:
            raise InvalidArgument(f"header {name} is over {MAX_HEADER_BYTES} bytes")


def _check_seconds(name: str, value: Any, low: float, high: float, *, zero_ok: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) \
            or value > high or value < low or (value == low and not zero_ok):
        bound = ">=" if zero_ok else ">"
        raise InvalidArgument(f"{name} must be a number of seconds {bound} {low:g} and <= "
                              f"{high:g}, got {value!r}")


# -- what the master knows of tasks ------------------------------------------------------------


class Enqueuing(Protocol):
    """What ``enqueue_task`` needs of a client (``Client`` or ``ShardedClient``)."""

    def enqueue(self, queue: str, data: bytes, *, priority: int = 0, delay_s: float = 0.0,
                not_before: Any = None, key: str | None = None, coalesce: bool = False) -> int: ...


def enqueue_task(client: Enqueuing, queue: str, task: HttpTask, *, priority: int = 0,
                 delay_s: float = 0.0, key: str | None = None) -> int:
    """Enqueue one checked task on ``client`` (a ``blizzard.Client``); returns its id."""
    return client.enqueue(queue, task.encode(), priority=priority, delay_s=delay_s, key=key)


def bury(client: Any, msgs: list[Any], error: str, priority: int | None = None) -> None:
    """Move leased messages to their dead-letter queue now, with ``error`` as the last error
    (``priority``: at that priority from now on).

    For a task whose own ``max_attempts`` are spent; ``LeaseExpired`` if a lease was lost.
    """
    lost: list[int] = []
    for link, group in _by_master(client, msgs, lambda m: m.id):
        reply: p.Acked = link.call(p.Bury([m.id for m in group], [m.lease for m in group],
                                          str(error), priority))
        lost += reply.lost
    if lost:
        raise LeaseExpired(f"items {lost[:10]} were no longer leased under the tokens "
                           "given; they were not buried")


def lookup(client: Any, ids: list[int]) -> list[dict[str, Any]]:
    """Each item's task state, queue, attempts, last error and ``until`` (see ``ItemStates``)."""
    if not ids or len(ids) > p.MAX_BATCH:
        raise InvalidArgument(f"look up 1..{p.MAX_BATCH} ids at once, not {len(ids)}")
    found: dict[int, dict[str, Any]] = {}
    for link, group in _by_master(client, list(ids), lambda i: i):
        reply: p.ItemStates = link.call(p.Lookup(group))
        for i in range(len(reply.ids)):
            found[reply.ids[i]] = {"id": reply.ids[i], "state": reply.states[i],
                                   "queue": reply.queues[i] or None,
                                   "attempts": reply.attempts[i], "error": reply.errors[i],
                                   "until": reply.until[i] or None}
    return [found[i] for i in ids if i in found]


def task_counts(client: Any, queue: str) -> dict[str, Any]:
    """A queue's items by task state: queued, scheduled, in_flight, succeeded, failed."""
    check_queue_name(queue)
    counts = {"queue": queue, "queued": 0, "scheduled": 0, "in_flight": 0, "succeeded": 0,
              "failed": 0}
    for shard in getattr(client, "shards", [client]):  # a sharded queue: summed over shards
        reply: p.TaskCounts = shard.master.call(p.TaskStats(queue))
        for name in ("queued", "scheduled", "in_flight", "succeeded", "failed"):
            counts[name] += getattr(reply, name)
    return counts


def _by_master(client: Any, things: list[Any], id_of: Any) -> list[tuple[Any, list[Any]]]:
    """``things`` grouped by the master link that holds each (by its item id's shard when
    ``client`` is a ``ShardedClient``)."""
    shards = getattr(client, "shards", None)
    if shards is None:
        return [(client.master, things)]
    groups: dict[int, list[Any]] = {}
    for thing in things:
        groups.setdefault(shard_of(id_of(thing)), []).append(thing)
    return [(shards[k].master, group) for k, group in groups.items()]
