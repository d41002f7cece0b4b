"""The data source's options: what ``.option(...)`` accepts, parsed once into frozen dataclasses.

Spark hands options over as a case-insensitive map of strings; unknown names are refused so
that a typo (``maxItemPerBatch``) fails loudly instead of being ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from blizzard.net.defaults import DEFAULT_MASTER
from blizzard.wire.errors import InvalidArgument

MiB = 1024 * 1024


def _positive_int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgument(f"option {name} must be an integer, got {text!r}") from None
    if value <= 0:
        raise InvalidArgument(f"option {name} must be positive, got {value}")
    return value


def _seconds(name: str, text: str, *, zero_ok: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InvalidArgument(f"option {name} must be a number of seconds, got {text!r}") from None
    if value < 0 or (value == 0 and not zero_ok) or value != value:
        raise InvalidArgument(f"option {name} must be {'>= 0' if zero_ok else '> 0'}, got {text}")
    return value


def _parse(cls: Any, options: Mapping[str, str],
           spellings: dict[str, tuple[str, Callable[[str, str], Any]]]) -> Any:
    """Build ``cls`` from Spark options; ``spellings`` maps option name -> (field, parser)."""
    given = {str(k).lower(): v for k, v in options.items()}
    known = {name.lower(): (name, spec) for name, spec in spellings.items()}
    unknown = sorted(set(given) - set(known) - {"path"})
    if unknown:
        raise InvalidArgument(f"unknown option(s) {', '.join(unknown)} for the blizzard data "
                              f"source; known: {', '.join(sorted(spellings))}")
    kwargs: dict[str, Any] = {}
    for key, value in given.items():
        if key in known:
            name, (field, parse) = known[key]
            kwargs[field] = parse(name, value)
    if "queue" not in kwargs:
        raise InvalidArgument("the blizzard data source needs .option('queue', NAME)")
    return cls(**kwargs)


def _text(name: str, value: str) -> str:
    if not value:
        raise InvalidArgument(f"option {name} must not be empty")
    return value


@dataclass(frozen=True, kw_only=True)
class ReadOptions:
    """Options of ``spark.readStream.format("blizzard")``."""

    master: str = DEFAULT_MASTER  # master address
    queue: str  # queue to read
    max_items_per_batch: int = 10_000  # items in one micro-batch at most
    max_bytes_per_batch: int = 1024 * MiB  # payload bytes in one micro-batch (may overshoot a
    # little); executors stream them in chunks of 8 MiB, the driver holds only ids and sizes
    lease_s: float = 60.0  # lease length; renewed every lease_s / 3 while a batch is in flight
    wait_s: float = 1.0  # an idle stream long-polls the master this long per trigger
    timeout_s: float = 30.0  # give up on an unresponsive master after this long
    node_timeout_s: float = 5.0  # try another replica after a data node is silent this long
    timings_dir: str | None = None  # append per-stage timings here (``timings.py``); None: off

    SPELLINGS: ClassVar[dict[str, tuple[str, Callable[[str, str], Any]]]] = {
        "master": ("master", _text), "queue": ("queue", _text),
        "maxItemsPerBatch": ("max_items_per_batch", _positive_int),
        "maxBytesPerBatch": ("max_bytes_per_batch", _positive_int),
        "leaseSeconds": ("lease_s", _seconds),
        "waitSeconds": ("wait_s", lambda n, v: _seconds(n, v, zero_ok=True)),
        "timeoutSeconds": ("timeout_s", _seconds),
        "nodeTimeoutSeconds": ("node_timeout_s", _seconds),
        "timingsDir": ("timings_dir", _text),
    }

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        return _parse(cls, options, cls.SPELLINGS)


@dataclass(frozen=True, kw_only=True)
class WriteOptions:
    """Options of ``df.write.format("blizzard")``."""

    master: str = DEFAULT_MASTER
    queue: str
    timeout_s: float = 30.0
    # The master's --pending-timeout-s: staged items older than this at job commit may have been
    # dropped, so the commit is refused (nothing becomes visible) rather than made in part.
    pending_timeout_s: float = 30.0

    SPELLINGS: ClassVar[dict[str, tuple[str, Callable[[str, str], Any]]]] = {
        "master": ("master", _text), "queue": ("queue", _text),
        "timeoutSeconds": ("timeout_s", _seconds),
        "pendingTimeoutSeconds": ("pending_timeout_s", _seconds),
    }

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        return _parse(cls, options, cls.SPELLINGS)

