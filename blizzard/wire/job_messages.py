"""The messages of the job features that stand apart from the leases: cancelling jobs and
keeping schedules (master/jobs/status.py, master/jobs/schedules.py), and the words they share (how
a job ended, what a failed dependency does, a job's states).

One family of the protocol; import its messages from ``blizzard.wire.protocol``, the one
namespace of every message. ``Jobs`` and ``JobStates``, which carry a ``Leased``, are there.
"""

from __future__ import annotations

from blizzard.wire.codec import Id, field, message
from blizzard.wire.node_messages import PutGrant

# How a job ended, as its result says (``Enqueue.result_kind``)
RESULT_DONE, RESULT_FAILED, RESULT_CANCELLED = 0, 1, 2
# What a dependency ending dead or cancelled does to a job waiting on it
DEPENDENCY_CANCEL, DEPENDENCY_DEAD = 0, 1


# A job's status, as ``JobStates.states`` says it ("waiting": for its dependencies)
JOB_STATES = ("queued", "delayed", "waiting", "running", "failed", "done", "dead", "cancelled",
              "unknown")
FINAL_STATES = frozenset(("done", "dead", "cancelled", "unknown"))


# Why a job was not cancelled (``Acked.why`` of a Cancel's reply, one per ``lost`` id)
NOT_CANCELLED_FINAL = 0  # done, dead or cancelled already
NOT_CANCELLED_UNKNOWN = 1  # no such job (never made, or finished and forgotten)
NOT_CANCELLED_SCHEDULE = 2  # a schedule's job: remove the schedule instead


@message(66)
class Cancel:
    """Cancel jobs: a queued or delayed one is removed at once, a running one is told on its
    worker's next lease extension (``Acked.cancel``). Reply ``Acked``: ``lost`` the ids not
    cancelled, each for the reason (``NOT_CANCELLED_*``) at the same place in ``why``."""

    ids: list[Id]


@message(88)
class ScheduleSpec:
    """A schedule as declared: its name, the queue its job goes to, when (a cron expression
    in ``timezone``, or every ``every_s`` seconds) and whether a tick missed while no master
    ran runs once when one is back (``catch_up``) or is skipped."""

    name: str
    queue: str
    cron: str
    every_s: float
    timezone: str
    catch_up: bool


@message(67)
class SetSchedule:
    """Make (or change) schedule ``spec``: ``item``, an item of its queue staged for this
    (``Client.stage``: its call, stored on ``stored_on``, which ``grants`` prove the caller
    staged), runs at each of its ticks. A schedule of that name that is the same already
    (spec and call) is kept and ``item`` is not committed: several workers declaring one
    schedule make one. Reply ``ScheduleList``."""

    spec: ScheduleSpec
    item: Id
    stored_on: list[str]
    grants: list[PutGrant]


@message(68)
class ListSchedules:
    """The schedules named (none: all). Reply ``ScheduleList``."""

    names: list[str] = field(default_factory=list)


@message(69)
class RemoveSchedule:
    """End schedule ``name``. Reply ``ScheduleList``: it, as it was (none: no such)."""

    name: str


@message(85)
class ScheduleInfo:
    """One schedule: its spec, its job (the item each run is), the next tick (unix time),
    its runs since it was made, its call's size and checksum, and its job's state and last
    error."""

    spec: ScheduleSpec
    job: Id
    next_at: float
    runs: int
    size: int
    crc: int
    state: str
    error: str


@message(86)
class ScheduleList:
    schedules: list[ScheduleInfo]
