"""A queue's settings, defined once: each one's name, type, default, bounds and help.

``Settings`` is the one definition. Everything else that names the settings derives from it:
the wire messages ``QueueSettings`` and ``Configure`` (``protocol.py``) and the master's WAL
record ``ConfigureQueue`` (``master/state/records.py``) take their fields from ``with_settings``;
the master's ``QueueConfig`` (``master/state/queue_config.py``) is a ``Settings``; the client checks
``configure_queue``'s keywords with ``check_changes``; the CLI builds its ``--lease-s``
style options from ``SETTINGS``.

The field order is the order on the wire, in WAL records and in checkpoints, all of them
positional msgpack arrays: never reorder or remove a setting. A new one goes at the end, and
old records, which lack it, must still load (a new record code, or a decoder that fills in
the default; ``tests/test_queue_settings.py`` holds old bytes that must keep decoding).
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from blizzard.wire.codec import brief
from blizzard.wire.errors import InvalidArgument
from blizzard.wire.limits import MAX_LEASE_S, MAX_RESULT_TTL_S, MIN_LEASE_S

MAX_COUNT = 1_000_000  # max_attempts and burst
MAX_QUEUE_NAME = 200  # characters in a queue name (a dead-letter queue's may add ".dead")
QUEUE_NAME_CHARS = "A-Z a-z 0-9 . _ : -"
_QUEUE_NAME = re.compile(r"[A-Za-z0-9._:-]+")
DEAD_SUFFIX = ".dead"  # a queue's dead-letter queue by default: its name plus this
RESULTS_SUFFIX = ".results"  # where a queue's task results are kept: its name plus this
MAX_ATTRIBUTES = 4096  # characters of a queue's ``attributes`` text
FIRST_SETTINGS = 7  # settings every record and frame has had; later ones have defaults there
MAX_VALID_NAMES = 4096  # queue names remembered as valid (checked again once forgotten)
_VALID_NAMES: set[str] = set()


def results_queue(queue: str) -> str:
    """Where the results of ``queue``'s jobs are kept (``blizzard/worker``,
    master/jobs/status.py)."""
    return queue + RESULTS_SUFFIX


def check_queue_name(name: Any, what: str = "queue name") -> str:
    """``name`` if it is a valid queue name, else ``InvalidArgument`` saying what is valid.

    Valid: 1-200 of the characters A-Z a-z 0-9 . _ : - (so a name needs no quoting in a shell,
    a URL or a metric label); a default dead-letter queue's name may add ".dead" to that, and
    a results queue's ".results".
    """
    if type(name) is str and name in _VALID_NAMES:  # every request names its queue
        return name
    limit = MAX_QUEUE_NAME
    if isinstance(name, str):
        limit += sum(len(suffix) for suffix in (DEAD_SUFFIX, RESULTS_SUFFIX)
                     if name.removesuffix(RESULTS_SUFFIX).endswith(suffix) or
                     name.endswith(suffix))
    if type(name) is not str or not 0 < len(name) <= limit or not _QUEUE_NAME.fullmatch(name):
        raise InvalidArgument(f"{what} {brief(name)} is not valid: use 1-{MAX_QUEUE_NAME} of the "
                              f"characters {QUEUE_NAME_CHARS} (no spaces)")
    if len(_VALID_NAMES) >= MAX_VALID_NAMES:  # a peer naming new queues must not grow it
        _VALID_NAMES.clear()
    _VALID_NAMES.add(name)
    return name


def _setting(default: Any, low: float, high: float, help: str) -> Any:
    """A field of ``Settings``: its default, inclusive bounds (a text's: its length) and help."""
    return field(default=default, metadata={"low": low, "high": high, "help": help})


@dataclass(frozen=True)
class Settings:
    """How one named queue behaves; a queue never configured has these defaults."""

    lease_s: float = _setting(30.0, MIN_LEASE_S, MAX_LEASE_S,
                              "Lease length when a consumer names none, in seconds.")
    max_attempts: int = _setting(10, 0, MAX_COUNT,
                                 "Deliveries (expired or nacked leases) before an item moves to "
                                 "the dead-letter queue; 0: unlimited.")
    dead_letter: str = _setting("", 0, MAX_QUEUE_NAME,
                                "Where dead items go; empty: the queue's name plus '.dead'.")
    backoff_base_s: float = _setting(0.0, 0.0, 86400.0,
                                     "Retry delay after the first failure, doubling per "
                                     "attempt; 0: retry at once.")
    backoff_cap_s: float = _setting(300.0, 0.0, 7 * 86400.0, "The longest retry delay.")
    rate_per_s: float = _setting(0.0, 0.0, 1e7,
                                 "Leases granted per second over all consumers together; "
                                 "0: unlimited.")
    burst: int = _setting(0, 0, MAX_COUNT,
                          "Leases that may be granted at once after idling; 0: max(1, rate).")
    attributes: str = _setting("", 0, MAX_ATTRIBUTES,
                               "Text a front end keeps with the queue (the SQS gateway: the "
                               "queue's SQS attributes and tags, as JSON); the master only "
                               "stores it.")
    paused_until: float = _setting(0.0, 0.0, 1e11,
                                   "Unix time before which no lease is granted (beanstalkd's "
                                   "pause-tube); 0: not paused.")
    result_ttl_s: float = _setting(86400.0, 0.0, MAX_RESULT_TTL_S,
                                   "How long a task's result is kept, in seconds (a @task's own "
                                   "result_ttl_s wins); 0: none kept.")

    @classmethod
    def option_names(cls) -> list[str]:
        """The settings' names in their fixed order (the master's checkpoint rows use it)."""
        return list(NAMES)

    def validate(self) -> Self:
        """Check every setting's type and bounds; ``InvalidArgument`` names the first bad one."""
        for s in SETTINGS:
            s.check(getattr(self, s.name))
        return self

    def as_dict(self) -> dict[str, Any]:
        """Name -> value, in order: what a message or record built from these settings takes."""
        return {name: getattr(self, name) for name in NAMES}


@dataclass(frozen=True)
class Setting:
    """One row of ``Settings``, as the checks and the CLI read it."""

    name: str
    kind: type  # float, int or str
    default: Any
    low: float
    high: float
    help: str

    def check(self, value: Any) -> Any:
        """``value`` as this setting's type (an int for a float is fine), or ``InvalidArgument``."""
        if self.kind is str:
            if type(value) is not str or not self.low <= len(value) <= self.high:
                raise InvalidArgument(f"queue option {self.name} must be a string of at most "
                                      f"{self.high:g} characters, got {brief(value)}")
            return value
        if self.kind is int:
            ok = type(value) is int
        else:
            ok = type(value) in (int, float) and math.isfinite(value)
        if not ok or not self.low <= value <= self.high:
            kind = "an integer" if self.kind is int else "a number"
            raise InvalidArgument(f"queue option {self.name} must be {kind} in "
                                  f"[{self.low:g}, {self.high:g}], got {brief(value)}")
        return self.kind(value)


def _rows() -> tuple[Setting, ...]:
    types = typing.get_type_hints(Settings)
    return tuple(Setting(f.name, types[f.name], f.default, f.metadata["low"], f.metadata["high"],
                         f.metadata["help"]) for f in dataclasses.fields(Settings))


SETTINGS = _rows()  # in wire and WAL order
NAMES = tuple(s.name for s in SETTINGS)
BY_NAME = {s.name: s for s in SETTINGS}


def check_changes(options: Mapping[str, Any]) -> dict[str, Any]:
    """The settings to change, each checked; a None value means "leave it as it is".

    Raises ``InvalidArgument`` naming the unknown options and the valid ones, or the first
    setting whose value is of the wrong type or out of bounds.
    """
    unknown = sorted(set(options) - set(NAMES))
    if unknown:
        raise InvalidArgument(f"unknown queue option(s) {', '.join(map(str, unknown))}; "
                              f"valid: {', '.join(NAMES)}")
    return {name: BY_NAME[name].check(options[name])
            for name in NAMES if options.get(name) is not None}


def with_settings(*, optional: bool = False) -> Callable[[type], type]:
    """Class decorator: append every setting as a field to a message class, in ``NAMES`` order.

    ``optional``: each field may be None (a ``Configure`` names only what it changes). Apply it
    below the registry's ``@message``, which makes the class a dataclass.

    The settings added after the first ``FIRST_SETTINGS`` get a default (None where optional),
    so records and frames written before they existed, which lack them, still decode.
    """

    def add(cls: type) -> type:
        own = dict(cls.__dict__.get("__annotations__", {}))
        clash = own.keys() & set(NAMES)
        if clash:
            raise TypeError(f"{cls.__name__} declares queue settings itself: {sorted(clash)}")
        cls.__annotations__ = own | {s.name: s.kind | None if optional else s.kind
                                     for s in SETTINGS}
        for s in SETTINGS[FIRST_SETTINGS:]:
            setattr(cls, s.name, None if optional else s.default)
        return cls

    return add
