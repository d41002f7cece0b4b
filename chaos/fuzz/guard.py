"""Which hostile frames would be real requests about the user's own items, queues or nodes.

The fuzzer sends with keys the servers admit. A frame that decodes (as the server decodes
it) to a valid request naming a real item, queue or node is not hostile input but an
authorised request -- a ``Delete`` of a real blob sent with the client key, a ``Purge`` of
the real queue with the admin key, a heartbeat claiming a real node's id -- and doing what it
says is the server's job. The templates avoid such values (far ids, names of their own);
mutation can still land on one (a far id whose bytes are changed into a small int), so
``Protected.touches`` picks those frames out and the fuzzer sends another instead, counting
them as ``spared``. What the fuzz probes is parsing and validation, not authorisation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from blizzard.wire import codec
from blizzard.wire import protocol as p

MESSAGES = frozenset(p.WIRE.by_op.values())


def _id_fields(cls: type) -> tuple[frozenset[str], tuple[str, ...]]:
    """(fields typed as item ids, every field) of a message class."""
    return codec.id_fields(cls), codec.fields_of(cls)


@dataclass(frozen=True)
class Protected:
    """Item ids and names (queues, node ids, addresses) no fuzzed frame may name."""

    ids: frozenset[int]
    names: frozenset[str]

    @classmethod
    def of(cls, ids: Iterable[int], names: Iterable[str]) -> Protected:
        return cls(frozenset(ids), frozenset(names))

    def touches(self, frames: list[bytes]) -> bool:
        """True if a frame decodes to a message naming a protected id or name."""
        for body in frames:
            try:
                _, msg = p.decode(body)
            except Exception:  # what the server cannot decode reaches no handler
                continue
            if self._names_one(msg):
                return True
        return False

    def _names_one(self, value: Any, is_id: bool = False) -> bool:
        if isinstance(value, str):
            return value in self.names
        if isinstance(value, bool) or value is None:
            return False
        if isinstance(value, int):
            return is_id and value in self.ids
        if isinstance(value, (list, tuple)):
            return any(self._names_one(v, is_id) for v in value)
        if type(value) in MESSAGES:
            ids, names = _id_fields(type(value))
            return any(self._names_one(getattr(value, n), n in ids) for n in names)
        return False
