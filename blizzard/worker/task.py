"""Python functions as jobs: ``@task`` ties a function to a queue, ``enqueue`` sends a call.

Not to be confused with HTTP tasks (``Client.enqueue_task``, ``blizzard/client/http_delivery.py``),
requests that ``blizzard dispatch`` makes; an ``@task`` call runs in ``blizzard worker``.

A call travels as one item, the msgpack array ``[CALL_VERSION, name, args, kwargs]``
(``encode_call``): several tasks may share a queue, and ``blizzard worker`` finds the function
by its task name (the function's ``__name__`` unless ``@task(name=...)`` says otherwise).
Arguments must be msgpack types: None, bool, int, float, str, bytes, lists (a tuple arrives as
a list) and dicts.

Queue settings: the keywords of ``@task`` besides ``queue`` and ``name`` (``max_attempts``,
``backoff_base_s``, ... any field of ``queue_settings.Settings``) are the queue's settings
*when it is created*. A process's first ``enqueue`` to the queue, and ``blizzard worker`` at
start, create it with them if it does not exist yet (a client key may create a queue). A queue
that exists keeps its settings, since changing them is an admin's (``blizzard queue config``);
a difference is logged as a warning. So ``max_attempts=5`` means: the fifth failed delivery
moves the item to the dead-letter queue, with the last error.

Which cluster: ``enqueue`` uses a ``Client`` per thread (a client is not thread-safe), made on
first use from ``configure(master=..., keys=..., timeout_s=...)``; what that leaves unset comes
from ``BLIZZARD_MASTER`` (else tcp://127.0.0.1:5555) and ``BLIZZARD_KEYS``.
``make_thumbnail.with_options(client=c)`` uses a client of your own instead.

``tasks_in`` finds the tasks a worker's modules hold; ``settings_of``, what they say of a queue.

The package exports the decorator as ``blizzard.worker.task``, which hides this module's name there:
take its other names with ``from blizzard.worker.task import ...``.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from blizzard.client.api import BlizzardClient
from blizzard.client.core import Client
from blizzard.client.enqueue_options import EnqueueOptions
from blizzard.client.schedules import check_spec
from blizzard.net.defaults import DEFAULT_MASTER
from blizzard.wire.codec import brief, dumps, loads
from blizzard.wire.errors import InvalidArgument, ProtocolError, QueueExists
from blizzard.wire.queue_settings import BY_NAME, RESULTS_SUFFIX, check_changes, check_queue_name
from blizzard.worker.results import JobHandle

__all__ = ["Task", "Group", "group", "configure", "task", "encode_call", "decode_call",
           "format_call", "ensure_queue", "tasks_in", "settings_of"]

log = logging.getLogger(__name__)

CALL_VERSION = 1
MASTER_ENV = "BLIZZARD_MASTER"


def encode_call(name: str, args: Iterable[Any], kwargs: Mapping[str, Any]) -> bytes:
    """One call of task ``name`` as an item's payload; ``InvalidArgument`` if an argument is
    not a msgpack type."""
    try:
        return dumps([CALL_VERSION, name, list(args), dict(kwargs)])
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgument(f"task {name}: arguments must be msgpack types (None, bool, int, "
                              f"float, str, bytes, list, dict): {exc}") from None


def decode_call(data: bytes) -> tuple[str, list[Any], dict[str, Any]]:
    """``(name, args, kwargs)`` of a payload made by ``encode_call``; ``ProtocolError`` saying
    what is wrong with anything else."""
    hint = f"an item of {len(data)} bytes not enqueued by a task?"
    try:
        call = loads(data)
    except ProtocolError as exc:
        raise ProtocolError(f"{exc.message} ({hint})") from None
    if type(call) is not list or len(call) != 4 or call[0] != CALL_VERSION:
        raise ProtocolError(f"not a task call [{CALL_VERSION}, name, args, kwargs] ({hint})")
    _, name, args, kwargs = call
    if type(name) is not str or type(args) is not list or type(kwargs) is not dict \
            or not all(type(k) is str for k in kwargs):
        raise ProtocolError(f"a task call needs a name, a list of args and a dict of kwargs "
                            f"with string keys; its name is {brief(name)}")
    return name, args, kwargs


def format_call(data: bytes) -> str | None:
    """A payload made by ``encode_call`` as the call reads in Python, ``always_fails(42)`` or
    ``thumb('a.png', size=128)`` (for people: ``queue peek`` of a dead-letter queue); None
    if ``data`` is not a task call."""
    try:
        name, args, kwargs = decode_call(data)
    except ProtocolError:
        return None
    shown = [repr(a) for a in args]
    shown += [f"{k}={v!r}" for k, v in kwargs.items() if k.isidentifier()]
    odd = {k: v for k, v in kwargs.items() if not k.isidentifier()}  # no keyword could be
    if odd:
        shown.append(f"**{odd!r}")
    return f"{name}({', '.join(shown)})"


# -- the queue's settings ----------------------------------------------------------------------

def declare_schedule(client: BlizzardClient, t: Task) -> None:
    """Make ``t``'s schedule on the cluster (kept as it is if the same; one per task name)."""
    assert t.schedule is not None
    s = t.schedule
    client.schedule(t.name, t.queue, encode_call(t.name, [], {}), cron=s.cron, every_s=s.every_s,
                    timezone=s.timezone, catch_up=s.catch_up)


def ensure_queue(client: BlizzardClient, queue: str, settings: Mapping[str, Any]) -> None:
    """Create ``queue`` with ``settings`` unless it exists; warn if it exists with others."""
    try:
        client.create_queue(queue, **settings)
    except QueueExists:
        current = client.queue_config(queue)
        differ = {k: v for k, v in settings.items() if current.get(k) != v}
        if differ:
            log.warning("queue %s exists with other settings than its tasks name (%s); it keeps "
                        "them: change them with `blizzard queue config %s` (an admin key)",
                        queue, ", ".join(f"{k}={current.get(k)!r}, task says {v!r}"
                                         for k, v in sorted(differ.items())), queue)


_ensured: weakref.WeakKeyDictionary[Client, set[str]] = weakref.WeakKeyDictionary()
_ensured_lock = threading.Lock()


def _ensure_once(client: Client, queue: str, settings: Mapping[str, Any]) -> None:
    """``ensure_queue`` the first time ``client`` enqueues to ``queue`` (one round trip)."""
    with _ensured_lock:
        seen = _ensured.setdefault(client, set())
        if queue in seen:
            return
    ensure_queue(client, queue, settings)
    with _ensured_lock:
        seen.add(queue)


# -- the default client ------------------------------------------------------------------------

@dataclass
class _Defaults:
    """How ``enqueue`` without a client of its own connects: set by ``configure``."""

    master: str | None = None
    keys: str | None = None
    timeout_s: float = 30.0
    generation: int = 0  # bumped by ``configure``: thread clients made before are replaced
    local: threading.local = field(default_factory=threading.local)

    def client(self) -> Client:
        """This thread's client, made (or remade after ``configure``) on first use."""
        mine = getattr(self.local, "client", None)
        if mine is not None and self.local.generation == self.generation:
            return mine
        self.close_thread_client()
        master = self.master or os.environ.get(MASTER_ENV) or DEFAULT_MASTER
        self.local.client = Client(master, timeout_s=self.timeout_s, keys=self.keys)
        self.local.generation = self.generation
        return self.local.client

    def close_thread_client(self) -> None:
        mine = getattr(self.local, "client", None)
        if mine is not None:
            self.local.client = None
            mine.close()


_defaults = _Defaults()


def configure(*, master: str | None = None, keys: str | None = None,
              timeout_s: float = 30.0) -> None:
    """Where tasks enqueue when given no client: ``master`` (None: ``BLIZZARD_MASTER``, else
    tcp://127.0.0.1:5555), ``keys`` (a key directory; None: ``BLIZZARD_KEYS``)."""
    if timeout_s <= 0:
        raise InvalidArgument("timeout_s must be positive")
    _defaults.master, _defaults.keys, _defaults.timeout_s = master, keys, timeout_s
    _defaults.generation += 1


def close_thread_client() -> None:
    """Close this thread's default client, if it made one (a worker thread does, at its end)."""
    _defaults.close_thread_client()


# -- tasks -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sender:
    """Enqueues calls of one task with a client and enqueue options (``Task.with_options``)."""

    task: Task
    client: Client | None = None  # None: the thread's default client
    priority: int = 0
    delay_s: float = 0.0
    key: str | None = None
    unique_for_s: float | None = None  # None: the task's (``@task(unique_for_s=...)``)
    unique_key: str | None = None  # None: the task's name and the call's arguments
    depends_on: tuple[int, ...] = ()  # jobs that must be done first
    on_dependency_failure: str = "cancel"

    def enqueue(self, *args: Any, **kwargs: Any) -> JobHandle:
        """Send one call; returns its job's handle once the item is durable (a unique task's
        call made again while the first is queued or running: the first's)."""
        return self.enqueue_many([(args, kwargs)])[0]

    def enqueue_many(self, calls: Iterable[Any]) -> list[JobHandle]:
        """Send many calls in one pipelined batch; each is a tuple of positional arguments, a
        dict of keyword arguments, or an ``(args tuple, kwargs dict)`` pair. A unique task's
        calls go one by one, each with its unique key. Their jobs' handles, in order."""
        client = self.client or _defaults.client()
        ask = (lambda: client) if self.client is not None else _defaults.client
        return [JobHandle(item_id, self.task.queue, ask) for item_id in self._send(calls, client)]

    def _send(self, calls: Iterable[Any], client: Client) -> list[int]:
        task = self.task
        split = [_split(call) for call in calls]
        for args, kwargs in split:
            task.check_call(args, kwargs)
        items = [encode_call(task.name, args, kwargs) for args, kwargs in split]
        if task.settings:
            _ensure_once(client, task.queue, task.settings)
        unique_for_s = self.unique_for_s if self.unique_for_s is not None else task.unique_for_s
        if self.depends_on:
            return [client.enqueue(task.queue, item, priority=self.priority,
                                   delay_s=self.delay_s, key=self.key,
                                   unique_key=(self.unique_key or _call_key(task.name, *call))
                                   if unique_for_s else None,
                                   unique_for_s=unique_for_s or None,
                                   unique_until_done=bool(unique_for_s),
                                   depends_on=self.depends_on,
                                   on_dependency_failure=self.on_dependency_failure)
                    for item, call in zip(items, split, strict=True)]
        if unique_for_s:
            return [client.enqueue(task.queue, item, priority=self.priority,
                                   delay_s=self.delay_s, key=self.key,
                                   unique_key=self.unique_key or _call_key(task.name, *call),
                                   unique_for_s=unique_for_s, unique_until_done=True)
                    for item, call in zip(items, split, strict=True)]
        return client.enqueue_many(task.queue, items, priority=self.priority,
                                   delay_s=self.delay_s, key=self.key)


def _call_key(name: str, args: Iterable[Any], kwargs: Mapping[str, Any]) -> str:
    """A call's unique key: the digest of its task name and arguments (keyword arguments in
    any order)."""
    return "call:" + hashlib.sha256(dumps([name, list(args), sorted(kwargs.items())])
                                    ).hexdigest()


def _split(call: Any) -> tuple[Iterable[Any], Mapping[str, Any]]:
    """A call of ``enqueue_many`` as (args, kwargs)."""
    if isinstance(call, dict):
        return (), call
    if isinstance(call, tuple) and len(call) == 2 and isinstance(call[0], tuple) \
            and isinstance(call[1], dict):
        return call
    if isinstance(call, (tuple, list)):
        return call, {}
    raise InvalidArgument(f"a call is a tuple of arguments, a dict of keyword arguments or an "
                          f"(args, kwargs) pair, not {brief(call)}")


class Task:
    """A function that runs as a job on a queue: call it to run it here, ``enqueue`` it to have
    a ``blizzard worker`` run it."""

    def __init__(self, fn: Callable[..., Any], queue: str, name: str,
                 settings: Mapping[str, Any], unique_for_s: float | None = None,
                 result_ttl_s: float | None = None,
                 schedule: ScheduleSpec | None = None) -> None:
        self.fn = fn
        self.queue = check_queue_name(queue)
        self.name = name
        self.settings = check_changes(settings)  # InvalidArgument names a bad one
        if unique_for_s is not None:
            EnqueueOptions.make(unique_key="check", unique_for_s=unique_for_s)  # its bounds
        self.unique_for_s = unique_for_s
        if result_ttl_s is not None:
            BY_NAME["result_ttl_s"].check(result_ttl_s)  # the queue setting's bounds
        self.result_ttl_s = result_ttl_s  # None: its queue's
        if self.queue.endswith(RESULTS_SUFFIX):
            raise InvalidArgument(f"queue {self.queue} would hold results (its name ends "
                                  f"{RESULTS_SUFFIX}): choose another name")
        try:
            self.signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin without one: not checked
            self.signature = None
        if schedule is not None:
            check_spec(schedule.cron, schedule.every_s, schedule.timezone)
            self.check_call((), {})  # a scheduled run has no arguments
        self.schedule = schedule  # None: it runs when enqueued only
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def check_call(self, args: Iterable[Any], kwargs: Mapping[str, Any]) -> None:
        """``InvalidArgument`` if the function cannot take these arguments (as Python would
        say it: ``missing 1 required positional argument: 'y'``)."""
        if self.signature is None:
            return
        try:
            self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidArgument(f"task {self.name}{self.signature}: {exc}") from None

    @property
    def keeps_results(self) -> bool:
        """False when the task says it keeps none (``result_ttl_s=0``)."""
        return self.result_ttl_s != 0

    def __repr__(self) -> str:
        return f"<task {self.name} on queue {self.queue}>"

    def with_options(self, *, client: Client | None = None, priority: int = 0,
                     delay_s: float = 0.0, key: str | None = None,
                     unique_for_s: float | None = None,
                     unique_key: str | None = None, depends_on: Iterable[int] = (),
                     on_dependency_failure: str = "cancel") -> Sender:
        """Enqueue through ``client`` and/or with enqueue options (see ``Client.enqueue``):
        ``make_thumbnail.with_options(delay_s=60).enqueue("a.png", size=128)``.

        ``unique_for_s``: a call made again within that many seconds, while the first is
        queued or running, makes no job and returns the first's handle (the same task and
        arguments, or the same ``unique_key``); kept on the master's WAL.
        ``depends_on``: jobs (handles or ids) that must be done before this one runs; if one
        ends dead or cancelled, this one is cancelled (``on_dependency_failure="dead"``:
        moved to its dead-letter queue instead)."""
        if unique_for_s is not None:
            EnqueueOptions.make(unique_key="check", unique_for_s=unique_for_s)  # its bounds
        if unique_key is not None and not (unique_for_s or self.unique_for_s):
            raise InvalidArgument("unique_key needs unique_for_s (here or on the @task)")
        parents = EnqueueOptions.make(depends_on=depends_on,
                                      on_dependency_failure=on_dependency_failure).depends_on
        return Sender(self, client, priority, delay_s, key, unique_for_s, unique_key, parents,
                      on_dependency_failure)

    def enqueue(self, *args: Any, **kwargs: Any) -> JobHandle:
        """Send one call to the task's queue; returns its job's handle (``handle.id`` is the
        item id; ``handle.result()`` waits for the return value) once the item is durable."""
        return Sender(self).enqueue(*args, **kwargs)

    def enqueue_many(self, calls: Iterable[Any]) -> list[JobHandle]:
        """Send many calls at once (see ``Sender.enqueue_many`` for their forms)."""
        return Sender(self).enqueue_many(calls)


@dataclass(frozen=True)
class ScheduleSpec:
    """When a scheduled task runs (``@task(cron=...)`` or ``every_s=...``)."""

    cron: str = ""
    every_s: float = 0.0
    timezone: str = "UTC"
    catch_up: bool = True


def task(queue: str, *, name: str | None = None, unique_for_s: float | None = None,
         result_ttl_s: float | None = None, cron: str = "", every_s: float = 0.0,
         timezone: str = "UTC", catch_up: bool = True, overlap: bool = False,
         **settings: Any) -> Callable[[Callable[..., Any]], Task]:
    """Decorator: make a function a ``Task`` on ``queue``.

    ``name``: what the worker looks it up by (default the function's ``__name__``);
    ``unique_for_s``: a call of the same arguments within that many seconds, while the first
    is queued or running, is not queued again (``Task.with_options``); ``result_ttl_s``: how
    long its return value is kept for ``handle.result()`` (None: its queue's ``result_ttl_s``,
    a day by default; 0: none kept); ``cron`` (5 fields, or 6 with seconds first) or
    ``every_s``: a ``blizzard worker`` serving the queue declares the schedule, and the task
    runs, without arguments, at each tick (in ``timezone``; ``catch_up``: a tick missed while
    no master ran runs once when one is back; ``overlap`` must be False: a tick whose last
    run is still queued or running is skipped); other keywords are the queue's settings when
    this creates it (``max_attempts=5``, ``backoff_base_s=2``, ...; see
    ``blizzard.wire.queue_settings``).
    """
    if overlap:
        check_spec(cron, every_s, timezone, overlap)  # refused, saying why
    if not (cron or every_s) and (timezone != "UTC" or not catch_up):
        raise InvalidArgument("timezone and catch_up are a schedule's: give cron or every_s")
    schedule = ScheduleSpec(cron, float(every_s), timezone, catch_up) \
        if cron or every_s else None

    def wrap(fn: Callable[..., Any]) -> Task:
        return Task(fn, queue, name or fn.__name__, settings, unique_for_s, result_ttl_s,
                    schedule)
    return wrap


class Group:
    """Jobs run as one: ``then`` enqueues a callback that runs once every one is done
    (``blizzard.group([h1, h2]).then(report, "nightly")``)."""

    def __init__(self, jobs: Iterable[JobHandle | int]) -> None:
        self.jobs: list[Any] = list(jobs)
        if not self.jobs:
            raise InvalidArgument("a group needs at least one job")

    def then(self, callback: Task, *args: Any, client: Client | None = None,
             on_dependency_failure: str = "cancel", **kwargs: Any) -> JobHandle:
        """Enqueue ``callback(*args, **kwargs)`` to run once every job of the group is done
        (cancelled, or dead-lettered, if one of them ends dead or cancelled)."""
        return callback.with_options(client=client, depends_on=self.jobs,
                                     on_dependency_failure=on_dependency_failure
                                     ).enqueue(*args, **kwargs)

    def results(self, timeout_s: float = 30.0) -> list[Any]:
        """Every job's return value, in order (each waited for up to ``timeout_s``)."""
        if not all(isinstance(job, JobHandle) for job in self.jobs):
            raise InvalidArgument("results() needs the jobs' handles, not their ids")
        return [job.result(timeout_s) for job in self.jobs]


def group(jobs: Iterable[JobHandle | int]) -> Group:
    """A group of jobs (their handles): ``group([...]).then(fn, *args)``."""
    return Group(jobs)


def tasks_in(modules: Iterable[ModuleType]) -> dict[str, Task]:
    """The tasks the modules define or import, by name; ``InvalidArgument`` on two tasks of
    one name, or two tasks of one queue naming different settings for it."""
    by_name: dict[str, Task] = {}
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, Task):
                other = by_name.setdefault(value.name, value)
                if other is not value and other.fn is not value.fn:
                    raise InvalidArgument(f"two tasks are named {value.name!r}: give one "
                                          "@task(name=...)")
    for t in by_name.values():
        settings_of(by_name.values(), t.queue)
    return by_name


def settings_of(tasks: Iterable[Task], queue: str) -> dict[str, Any]:
    """The queue settings ``queue``'s tasks name; ``InvalidArgument`` if two disagree."""
    merged: dict[str, Any] = {}
    for t in tasks:
        if t.queue != queue:
            continue
        for key, value in t.settings.items():
            if merged.setdefault(key, value) != value:
                raise InvalidArgument(f"tasks of queue {queue} disagree on {key} ({merged[key]!r}"
                                      f" and {value!r}, task {t.name}): a queue has one setting")
    return merged
