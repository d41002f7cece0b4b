"""What a data node's writes wait on: replica confirmations, and the refusals of a pass."""

from __future__ import annotations

from dataclasses import dataclass, field

from blizzard.wire import protocol as p


@dataclass
class Refusals:
    """Ids of reported puts that were refused in this pass, by the reason."""

    by_error: dict[str, list[int]] = field(default_factory=dict)

    def add(self, ids: list[int], error: str) -> None:
        self.by_error.setdefault(error[:200], []).extend(ids)


@dataclass
class ReplicaWait:
    """A write waiting for replica confirmations: a client's Put, or a copy ordered by the
    master."""

    peer: bytes | None  # the client to answer; None for a copy order
    rid: int
    needed: int
    deadline: float
    stored: list[str]
    waiting: set[int] = field(default_factory=set)  # forward request ids
    copy: p.Replicated | None = None  # the report to send the master once a copy is confirmed
    done: bool = False
