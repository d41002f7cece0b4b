"""The messages of sharding: a queue's head on one shard, asked for or published.

One family of the protocol; import its messages from ``blizzard.wire.protocol``, the one
namespace of every message. A sharded client compares shards by their heads
(``blizzard/client/sharded/client.py``): it asks a few with ``Head`` (the paper's peek-d), or
follows the heads every master publishes (``master/shard/heads.py``) and asks none. Which shard an
id belongs to (``shard_of``, ``first_id``) and the topic heads are published under (``topic``)
are defined here and imported from here.
"""

from __future__ import annotations

from blizzard.wire.codec import message

SHARD_BITS = 56  # shard k hands out ids from k << SHARD_BITS on: an id names its shard
MAX_SHARDS = 128  # ids are below 2**63


def shard_of(item_id: int) -> int:
    """The shard that handed out ``item_id`` (and holds the item)."""
    return item_id >> SHARD_BITS


def first_id(shard: int) -> int:
    """The first id shard ``shard`` hands out (shard 0: 1, as an unsharded master)."""
    return max(1, shard << SHARD_BITS)


def topic(queue: str) -> bytes:
    """The PUB topic of a queue's heads: its name and a NUL (``jobs`` must not match
    ``jobs.dead``)."""
    return queue.encode() + b"\0"


@message(90)
class Head:
    """What a lease of ``queue`` would take first on this master (reply: ``QueueHead``)."""

    queue: str


@message(91)
class QueueHead:
    """A queue's head on one shard: ``ready`` items wait; the first has ``priority`` and was
    enqueued at ``enqueued_at`` (both 0 when ``ready`` is 0). Also what ``master/shard/heads.py``
    publishes, with ``shard`` saying whose it is."""

    queue: str
    shard: int
    ready: int
    priority: int
    enqueued_at: float
    seq: int = 0  # rises with every change on that master: the newer of two heads wins
