"""What an enqueue call takes, checked before anything is sent: options and payload bytes."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from blizzard.wire.errors import InvalidArgument
from blizzard.wire.limits import MAX_DEPENDENCIES, MAX_LEASE_S, MAX_UNIQUE_S

DEPENDENCY_FAILURE = {"cancel": 0, "dead": 1}  # protocol.DEPENDENCY_CANCEL, DEPENDENCY_DEAD


@dataclass(frozen=True)
class EnqueueOptions:
    """Per-call enqueue options (see ``Client.enqueue``)."""

    priority: int = 0
    delay_s: float = 0.0
    key: str = ""
    coalesce: bool = False
    unique_key: str = ""  # "": none (see Client.enqueue)
    unique_for_s: float = 0.0
    unique_until_done: bool = False
    create: bool = True  # False: an enqueue to a queue that does not exist is refused
    lease_s: float = 0.0  # the item's own lease when a consumer names none (0: the queue's)
    result_kind: int = 0  # results only: how their jobs ended (``protocol.RESULT_*``)
    depends_on: tuple[int, ...] = ()  # jobs that must be done first
    on_dependency_failure: int = 0  # ``protocol.DEPENDENCY_*``

    @classmethod
    def make(cls, priority: Any = 0, delay_s: Any = 0.0, not_before: Any = None, key: Any = None,
             coalesce: Any = False, unique_key: Any = None, unique_for_s: Any = None,
             unique_until_done: Any = False, create: Any = True,
             lease_s: Any = None, depends_on: Any = (),
             on_dependency_failure: Any = "cancel") -> EnqueueOptions:
        if type(priority) is not int:
            raise InvalidArgument(f"priority must be an integer, got {type(priority).__name__}")
        if isinstance(delay_s, bool) or not isinstance(delay_s, (int, float)) or delay_s < 0:
            raise InvalidArgument(f"delay_s must be a non-negative number, got {delay_s!r}")
        if not_before is not None:
            if delay_s:
                raise InvalidArgument("give delay_s or not_before, not both")
            stamp = not_before.timestamp() if hasattr(not_before, "timestamp") else not_before
            if isinstance(stamp, bool) or not isinstance(stamp, (int, float)):
                raise InvalidArgument("not_before must be a datetime or a unix timestamp")
            delay_s = max(0.0, stamp - time.time())
        if key is not None and not isinstance(key, str):
            raise InvalidArgument(f"key must be a string, got {type(key).__name__}")
        if coalesce and not key:
            raise InvalidArgument("coalesce=True needs a key")
        if unique_key is not None or unique_for_s is not None:
            if not isinstance(unique_key, str) or not unique_key:
                raise InvalidArgument("unique_key must be a non-empty string")
            if isinstance(unique_for_s, bool) or not isinstance(unique_for_s, (int, float)) \
                    or not 0 < unique_for_s <= MAX_UNIQUE_S:
                raise InvalidArgument(f"unique_for_s must be a number of seconds in (0, "
                                      f"{MAX_UNIQUE_S:g}], got {unique_for_s!r}")
        if lease_s is not None and (isinstance(lease_s, bool) or not isinstance(
                lease_s, (int, float)) or not 0 < lease_s <= MAX_LEASE_S):
            raise InvalidArgument(f"lease_s must be a number of seconds in (0, "
                                  f"{MAX_LEASE_S:g}], got {lease_s!r}")
        parents = tuple(depends_on)  # job ids (a JobHandle is its id)
        if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 63
                   for d in parents):
            raise InvalidArgument(f"depends_on names jobs by their handles or ids (integers), "
                                  f"not {parents[:3]!r}")
        parents = tuple(int(d) for d in parents)
        if len(parents) > MAX_DEPENDENCIES:
            raise InvalidArgument(f"a job may depend on at most {MAX_DEPENDENCIES} jobs")
        failure = DEPENDENCY_FAILURE.get(on_dependency_failure)
        if failure is None:
            raise InvalidArgument(f"on_dependency_failure is 'cancel' or 'dead', not "
                                  f"{on_dependency_failure!r}")
        return cls(priority, float(delay_s), key or "", bool(coalesce), unique_key or "",
                   float(unique_for_s or 0.0), bool(unique_until_done), bool(create),
                   float(lease_s or 0.0), 0, parents, failure)


def as_bytes(data: Any) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"payloads must be bytes, not {type(data).__name__} (encode text first)")
