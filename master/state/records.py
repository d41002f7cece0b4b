"""The master's write-ahead log records: every change to durable state is one of these.

Times in records are wall-clock seconds (``time.time()``), because they must mean the same
thing after a restart. Records are their own family of messages (codes 100+): ``pack``
and ``unpack`` here are the WAL's record codec, and a network frame never decodes as one.
On disk a record is the msgpack array ``[code, field_1, ..., field_n]``.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import TypeVar

from blizzard.wire.checked import Registry
from blizzard.wire.queue_settings import with_settings

RECORDS = Registry("WAL record")
pack = RECORDS.pack  # a record's bytes
unpack = RECORDS.unpack  # the record in a WAL body
R = TypeVar("R")  # a record class


# A function of the module, not ``RECORDS.message`` itself: mypy applies a dataclass_transform
# only through a decorator it can name statically; through a bound method it sees no fields,
# and every record's constructor looks like one of no arguments.
@typing.dataclass_transform(frozen_default=True)
def message(op: int) -> Callable[[type[R]], type[R]]:
    """Class decorator: make a frozen dataclass a WAL record with code ``op``."""
    return RECORDS.message(op)


@message(100)
class Reserve:
    """Ids below ``id_hi`` may be handed out; a restart resumes allocation at ``id_hi``."""

    id_hi: int


@message(101)
class CommitItems:
    """Items stored on ``nodes`` become visible in ``queue`` (parallel lists, one entry per item).

    With ``coalesce``, an item with a key replaces the waiting items of its queue with the
    same key: it takes the best priority and the earliest place in line among them.
    """

    queue: str
    ids: list[int]
    sizes: list[int]
    crcs: list[int]
    priorities: list[int]
    not_befores: list[float]  # 0: visible at once
    keys: list[str]  # "": no key
    coalesce: bool
    nodes: list[str]
    at: float
    request: str  # the client's commit id, remembered so a retried commit is answered once
    # per item, a unique key it takes in its queue until ``unique_until`` ("": none; [] none
    # at all); records written before unique keys lack both (master/state/unique_keys.py)
    uniques: list[str] = dataclasses.field(default_factory=list)
    unique_until: float = 0.0
    ttrs: list[float] = dataclasses.field(default_factory=list)  # per item, its own lease
    # the items are results: item i of job ``result_of[i]``, which ended as ``result_kind``
    # says (``protocol.RESULT_*``); each job keeps its latest result (master/jobs/status.py)
    result_of: list[int] = dataclasses.field(default_factory=list)
    result_kind: int = 0
    # every item waits until these jobs are done (master/state/job_book.py);
    # ``on_dependency_failure`` says what one of them ending dead or cancelled does to it
    depends_on: list[int] = dataclasses.field(default_factory=list)
    on_dependency_failure: int = 0


@message(102)
class LeaseItems:
    """Items are handed to a consumer under lease tokens ``leases`` until ``deadline``.

    ``request`` is the client's id for the lease call, so a retry after a lost reply (or a
    master restart) gets the same items instead of leasing more. Re-leasing an item under
    its current token moves its deadline (an extension).
    """

    ids: list[int]
    leases: list[int]
    deadline: float
    request: str
    deadlines: list[float] = dataclasses.field(default_factory=list)  # per item, if they differ


@message(103)
class AckItems:
    """Items are done (or purged, or replaced by coalescing) and forgotten."""

    ids: list[int]


@message(104)
class ReleaseItems:
    """Leased items go back to their queue, each visible from its ``not_befores`` entry.

    Each counts an attempt; an item that reaches its queue's max attempts moves to the
    dead-letter queue instead, keeping ``error`` as its last error.
    """

    ids: list[int]
    not_befores: list[float]
    error: str
    priorities: list[int] = dataclasses.field(default_factory=list)  # new ones ([]: kept)


@message(105)
class NodeSeen:
    """A data node registered at ``addr``; remembered so replicas stay reachable after a restart."""

    node_id: str
    addr: str


@message(106)
class AddReplicas:
    """``node`` now holds a confirmed copy of each of ``ids``."""

    ids: list[int]
    node: str


@message(107)
class DropReplicas:
    """``node`` no longer holds a usable copy of ``ids`` (lost, corrupt, or deleted as excess)."""

    ids: list[int]
    node: str


@message(108)
@with_settings()
class ConfigureQueue:
    """A queue's whole configuration (creating the queue if it is new).

    After ``queue`` come the fields of ``blizzard.wire.queue_settings.Settings``, in its order.
    """

    queue: str


@message(109)
class RedriveItems:
    """Dead items go back to the queue they died in, with their attempts reset."""

    ids: list[int]


# -- tasks (HTTP push delivery) ----------------------------------------------------------------


@message(120)
class BuryItems:
    """Leased items move to their dead-letter queue now, keeping ``error`` as their last error.

    A consumer's own retry policy gave up on them (a task's max attempts). Applied as a
    ``ReleaseItems`` whose items have no attempts left: each counts an attempt, and an item
    already dead stays in its dead-letter queue.
    """

    ids: list[int]
    error: str
    priorities: list[int] = dataclasses.field(default_factory=list)  # new ones ([]: kept)

    @property
    def not_befores(self) -> list[float]:
        return [0.0] * len(self.ids)


# -- cluster identity and operator removals (codes 110-119) ----------------------------------


@message(114)
class WakeItems:
    """Delayed items become ready now (beanstalkd's ``kick-job``)."""

    ids: list[int]


@message(115)
class ExpireUniques:
    """The unique keys whose time is up at ``at`` are dropped (logged when the keys reach a
    cap, so an enqueue finds room; a replay drops the same ones)."""

    at: float


# -- jobs: cancellation, progress, results running out (master/jobs/status.py; codes 116-119)
# -------


@message(116)
class CancelItems:
    """Jobs are cancelled: a waiting one (queued or delayed) is forgotten and
    remembered as cancelled; a leased one is marked, and its worker told on its next
    extension (given back, it is cancelled instead of queued again)."""

    ids: list[int]


@message(117)
class ProgressItems:
    """Leased jobs' progress (parallel lists): a fraction done, a note, and a state that a
    later attempt of the job gets back (b"": none)."""

    ids: list[int]
    fractions: list[float]
    notes: list[str]
    states: list[bytes]


@message(118)
class ForgetResults:
    """These result items ran out (their time to live ended): they and the jobs' links to
    them are forgotten."""

    ids: list[int]


@message(119)
class AddSchedule:
    """Schedule ``name``: item ``item`` of ``queue`` (its call) runs at each tick of ``cron``
    or every ``every_s`` seconds, the first at ``next_at``; a schedule of that name before is
    replaced (its item, if waiting, forgotten). master/jobs/schedules.py."""

    name: str
    queue: str
    item: int
    cron: str
    every_s: float
    timezone: str
    catch_up: bool
    next_at: float


@message(122)
class DropSchedule:
    """Schedule ``name`` ends; its item, if waiting, is forgotten."""

    name: str


@message(123)
class RearmItems:
    """Schedules' items wait for their next ticks (``not_befores``): a run ended (``ran``;
    ``error``: it failed for good), or a tick missed while no master ran is skipped."""

    ids: list[int]
    not_befores: list[float]
    error: str
    ran: bool


@message(110)
class ClusterCreated:
    """The master's cluster id, made once at its first start: data nodes of another refuse it."""

    cluster_id: str


@message(111)
class ForgetNode:
    """An operator removed a dead data node: it is no longer a replica of anything."""

    node_id: str


@message(112)
class DeleteItems:
    """An operator deleted these items (ready, delayed, dead, or leased when forced)."""

    ids: list[int]


@message(113)
class DeleteQueue:
    """An operator deleted a queue: its settings and every item still in it are forgotten."""

    queue: str


# -- high availability (codes 125-129) --------------------------------------------------------


@message(125)
class EpochBegun:
    """A standby became the primary (``master/ha/standby.py``): every promotion raises the epoch,
    and a master of an older one is fenced. It also ends the old sync standby: the new
    primary answers alone until a standby catches up with it."""

    epoch: int
    primary: str  # the new primary's address


@message(126)
class StandbySynced:
    """A standby caught up (``name``): from now on the primary answers a request only once
    the standby holds its records durably too. ``name`` "" detaches it (an operator's word)."""

    name: str
    addr: str


@message(127)
class NodeKeyBound:
    """Data node key ``key`` (its public key, z85) speaks for ``node_id`` from now on, and for
    no other node (``master/nodes/node_keys.py``)."""

    node_id: str
    key: str


# -- rebuild from the data nodes (codes 121-122) -----------------------------------------------


@message(121)
class RebuildItems:
    """Items a master rebuilt from its data nodes' metadata (``master/ha/rebuild.py``), held by
    ``nodes``, enter ``queue`` as the nodes knew them (parallel lists, one entry per item).

    ``attempts`` are the deliveries the nodes last heard of; ``origins`` the queue a dead item
    died in ("" for a live one), so a redrive still finds its home. ``at`` stands in for the
    enqueue time, which the nodes do not keep.
    """

    queue: str
    nodes: list[str]
    at: float
    ids: list[int]
    attempts: list[int]
    origins: list[str]
    sizes: list[int]
    crcs: list[int]
    priorities: list[int]
    not_befores: list[float]  # 0: visible at once
    keys: list[str]
