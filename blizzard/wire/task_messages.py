"""The messages of HTTP task delivery (``blizzard dispatch``) and of ``blizzard task``: items'
states by id (of any item, an HTTP task or not), a consumer's own give-up, counts by task state.

One family of the protocol; import its messages from ``blizzard.wire.protocol``, the one
namespace of every message. The master serves them in ``master/jobs/http_delivery.py``.
"""

from __future__ import annotations

from blizzard.wire.codec import Id, message

TASK_STATES = ("queued", "scheduled", "in_flight", "succeeded", "failed", "unknown")


@message(70)
class Lookup:
    """Ask for items' states by id; nothing is leased or changed."""

    ids: list[Id]


@message(71)
class ItemStates:
    """Reply to Lookup, one column per field: item i is ids[i], states[i], ...

    ``states[i]`` is one of ``TASK_STATES``. "succeeded" means acked: the master remembers
    its last 100,000 acks (``RECENT_ACKS``, ``master/state/machine.py``); older ones are "unknown",
    as are ids purged, replaced by coalescing or never enqueued.
    """

    ids: list[Id]
    states: list[str]
    queues: list[str]  # where the item is now ("" once it is gone)
    attempts: list[int]
    errors: list[str]  # the last error a consumer gave ("": none)
    until: list[float]  # scheduled: visible from; in flight: lease deadline (unix time); else 0


@message(72)
class Bury:
    """Move leased items to their dead-letter queue now, keeping ``error`` as their last error.

    For a consumer whose own retry policy gave up (a task's max attempts) before the queue's
    did. Counts an attempt, as a nack does; reply ``Acked``.
    """

    ids: list[Id]
    leases: list[int]
    error: str
    priority: int | None = None  # the items' new priority (beanstalkd's bury pri)


@message(73)
class TaskStats:
    """Ask for a queue's items counted by task state (``blizzard queue stats --tasks``)."""

    queue: str


@message(74)
class TaskCounts:
    """Reply to TaskStats. ``succeeded`` counts acks since the master started (soft state);
    ``failed`` the items of this queue in its dead-letter queue."""

    queue: str
    queued: int
    scheduled: int
    in_flight: int
    succeeded: int
    failed: int
