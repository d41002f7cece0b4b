"""Queue administration and inspection, mixed into ``Client``."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from blizzard import protocol as p
from blizzard.errors import InvalidArgument, ProtocolError
from blizzard.messages import Message

if TYPE_CHECKING:
    from blizzard.client import Client


class QueueAdmin:
    """Settings, counters, purge, peek and redrive of named queues; the cluster's status."""

    def stats(self: "Client", queue: str) -> dict[str, Any]:
        """A queue's counters: ready, delayed, leased, pending, dead, oldest_age_s."""
        return _stats_dict(self._master(p.Stats(queue)))

    def queue_config(self: "Client", queue: str) -> dict[str, Any]:
        """A queue's settings (defaults for a queue never configured)."""
        return dataclasses.asdict(self._master(p.Stats(queue)).settings)

    def create_queue(self: "Client", queue: str, **options: Any) -> dict[str, Any]:
        """Create a queue with settings (``QueueExists`` if it exists); returns its settings."""
        return self._configure(queue, True, options)

    def configure_queue(self: "Client", queue: str, **options: Any) -> dict[str, Any]:
        """Change some settings of a queue (creating it if new); returns all its settings.

        Options: lease_s, max_attempts (0: unlimited), dead_letter, backoff_base_s,
        backoff_cap_s, rate_per_s (0: unlimited), burst.
        """
        return self._configure(queue, False, options)

    def _configure(self: "Client", queue: str, create: bool, options: dict[str, Any]) -> dict[str, Any]:
        names = [f.name for f in dataclasses.fields(p.QueueSettings)]
        unknown = sorted(set(options) - set(names))
        if unknown:
            raise InvalidArgument(f"unknown queue option(s) {', '.join(unknown)}; "
                                  f"known: {', '.join(names)}")
        kinds = {f.name: f.type for f in dataclasses.fields(p.QueueSettings)}
        values = []
        for name in names:
            v = options.get(name)
            if v is not None and kinds[name] == "float" and type(v) is int:
                v = float(v)
            values.append(v)
        try:
            reply = self._master(p.Configure(queue, create, *values))
        except ProtocolError as exc:
            raise InvalidArgument(f"a queue option has the wrong type: {exc.message}") from None
        return dataclasses.asdict(reply.settings)

    def queues(self: "Client") -> list[dict[str, Any]]:
        """Every queue's counters."""
        return [_stats_dict(q) for q in self._master(p.ListQueues()).queues]

    def purge(self: "Client", queue: str) -> int:
        """Drop every waiting item of ``queue`` (leased ones stay); returns how many."""
        return self._master(p.Purge(queue)).done

    def redrive(self: "Client", queue: str, n: int = 10_000) -> int:
        """Move up to ``n`` dead items of ``queue`` back into it (attempts reset); how many."""
        return self._master(p.Redrive(queue, n)).done

    def peek(self: "Client", queue: str, n: int = 1) -> list[Message]:
        """The head items with payloads, without leasing them (their ``ack`` is a no-op error)."""
        items = self._leased_items(self._master(p.Peek(queue, n)))
        payloads, _ = self.fetch(items) if items else ({}, [])
        return [Message(i.id, payloads[i.id], queue, i.attempts, i.priority, i.enqueued_at, 0, self)
                for i in items if i.id in payloads]

    def status(self: "Client") -> p.ClusterStatus:
        """The cluster as the master sees it: data nodes and queues."""
        return self._master(p.Status())



def _stats_dict(s: p.QueueStats) -> dict[str, Any]:
    return {"queue": s.queue, "ready": s.ready, "delayed": s.delayed, "leased": s.leased,
            "pending": s.pending, "dead": s.dead, "oldest_age_s": s.oldest_age_s}


