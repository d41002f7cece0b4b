"""What a checkpoint's parts hold, by name, and how older layouts are read.

A checkpoint body is a header, then one row per item (see ``State.export_parts``). The
header is a map of named values; it names the columns of the item rows in ``item_fields``,
so a field added later is a new name, read as its default from checkpoints without it,
never a shifted column. Checkpoints written before names (a positional header list) still
load: ``read_header`` turns their header into the named form, whose rows have the columns
of ``LEGACY_ITEM_FIELDS``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from master.state.item import READY

VERSION = 2

ITEM_FIELDS = ("id", "queue", "size", "crc", "priority", "order", "key", "nodes", "attempts",
               "enqueued_at", "status", "lease", "lease_deadline", "not_before", "origin", "error",
               "ttr")
# The value of a column a checkpoint does not have; a column without one must be there.
ITEM_DEFAULTS: dict[str, Any] = {"attempts": 0, "status": READY, "lease": 0,
                                 "lease_deadline": 0.0, "not_before": 0.0, "origin": "",
                                 "error": "", "ttr": 0.0}

# The positional layout of the first checkpoints: header, queue settings, item columns.
LEGACY_HEADER = ("id_hi", "lease_seq", "node_addrs", "recent_leases", "recent_commits", "queues",
                 "recent_acks", "items")
LEGACY_QUEUE_FIELDS = ("lease_s", "max_attempts", "dead_letter", "backoff_base_s",
                       "backoff_cap_s", "rate_per_s", "burst")
LEGACY_ITEM_FIELDS = ITEM_FIELDS[:16]  # the positional layout's columns (no "ttr")


def read_header(part: Any) -> dict[str, Any]:
    """A checkpoint's header in the named form, whichever layout it was written in."""
    if isinstance(part, dict):
        if part.get("version", 0) > VERSION:
            raise ValueError(f"checkpoint format {part['version']} is newer than this master "
                             f"reads ({VERSION})")
        return part
    # the legacy layouts as they were written, truncation and all: the names cover the longest
    header = dict(zip(LEGACY_HEADER, part, strict=False))
    header["queues"] = [{"name": name, **dict(zip(LEGACY_QUEUE_FIELDS, values, strict=False))}
                        for name, *values in header["queues"]]
    header["item_fields"] = list(LEGACY_ITEM_FIELDS)
    return header


def row_reader(fields: list[str]) -> Callable[[list[Any]], list[Any]]:
    """A function that turns a row with the columns ``fields`` into one with ``ITEM_FIELDS``."""
    if tuple(fields) == ITEM_FIELDS:
        return lambda row: row
    unknown = set(fields) - set(ITEM_FIELDS)
    if unknown:
        raise ValueError(f"checkpoint item rows have fields this master does not know: "
                         f"{sorted(unknown)}")
    missing = [name for name in ITEM_FIELDS if name not in fields and name not in ITEM_DEFAULTS]
    if missing:
        raise ValueError(f"checkpoint item rows lack {missing}")
    where = [fields.index(name) if name in fields else None for name in ITEM_FIELDS]
    defaults = [ITEM_DEFAULTS.get(name) for name in ITEM_FIELDS]
    pairs = list(zip(where, defaults, strict=True))
    return lambda row: [row[k] if k is not None else d for k, d in pairs]
