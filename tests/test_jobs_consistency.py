"""The job features (results, cancellation, dependencies, schedules) as a replicated state
machine: a randomized property test (replay == live, restore(export) == live, invariants) and
one test per promise a distributed-systems review found broken, now kept."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blizzard.wire import codec
from blizzard.wire import protocol as p
from master.state import records
from master.state.item import DELAYED, LEASED, READY
from master.state.job_book import HELD_UNTIL
from master.state.machine import State
from master.state.queue_config import QueueConfig
from master.state.records import (
    AckItems,
    AddSchedule,
    BuryItems,
    CancelItems,
    CommitItems,
    ConfigureQueue,
    DeleteItems,
    DeleteQueue,
    DropSchedule,
    ForgetResults,
    LeaseItems,
    ProgressItems,
    RearmItems,
    RedriveItems,
    ReleaseItems,
    WakeItems,
)
from master.state.schedule_book import next_tick

from support.in_process_master import call, enqueue_msg, in_process_master, place, report

LATER = 1e9  # a delay that does not come due in these tests (no clock is involved)


def commit(ids, queue="q", *, at=100.0, result_of=(), kind=0, not_before=0.0, depends_on=(),
           on_failure=0, keys=None, coalesce=False) -> CommitItems:
    n = len(ids)
    return CommitItems(queue=queue, ids=list(ids), sizes=[1] * n, crcs=[0] * n,
                       priorities=[0] * n, not_befores=[not_before] * n,
                       keys=list(keys) if keys else [""] * n, coalesce=coalesce,
                       nodes=["dn-a"], at=at, request="", result_of=list(result_of),
                       result_kind=kind, depends_on=list(depends_on),
                       on_dependency_failure=on_failure)


def lease(ids, token=7) -> LeaseItems:
    return LeaseItems(ids=list(ids), leases=[token + k for k in range(len(ids))],
                      deadline=500.0, request="")


# -- invariants --------------------------------------------------------------------------------

def check_invariants(s: State) -> None:
    items, book = s.items, s.jobs
    counts: dict[str, list[int]] = {}
    for item in items.values():
        assert item.queue in s.queues, item
        c = counts.setdefault(item.queue, [0, 0, 0])
        c[item.status] += 1
        assert (item.id in s.held) == (item.status == LEASED), item
        assert (item.id in s.delays) == (item.status == DELAYED), item
    for name, q in s.queues.items():
        assert [q.n_ready, q.n_delayed, q.n_leased] == counts.get(name, [0, 0, 0]), name
        for key, ids in q.keyed.items():
            assert all(i in items and items[i].queue == name and items[i].key == key
                       for i in ids), (name, key)
    assert set(s.held) <= set(items) and set(s.delays) <= set(items)
    assert set(s.origins) <= set(items)
    # dependencies: waiting jobs exist, are held, and wait on existing unfinished parents
    for job, w in book.waiting.items():
        assert job in items, f"waiting job {job} is gone"
        assert items[job].status == DELAYED and s.delays[job] == HELD_UNTIL, \
            f"waiting job {job} is not held: {items[job]}"
        assert w.on, job
        for parent in w.on:
            assert parent in items, f"job {job} waits on {parent}, which is gone"
            assert parent not in s.origins, f"job {job} waits on dead {parent}"
            assert job in book.dependents.get(parent, ()), (job, parent)
    for parent, children in book.dependents.items():
        assert children, parent
        for child in children:
            assert parent in book.waiting[child].on, (parent, child)
    # results
    for job, r in book.results.items():
        assert r.item in items, f"job {job}'s result {r.item} is gone"
        assert book.result_jobs[r.item] == job
    assert len(book.result_jobs) == len(book.results)
    assert not (book.cancels - {i for i in items if items[i].status == LEASED})
    assert book.progress_bytes == sum(len(pr.state) for pr in book.progress.values())
    # schedules
    for name, sch in s.schedules.by_name.items():
        assert s.schedules.by_item[sch.item] == name
        assert sch.item in items, f"schedule {name}'s item {sch.item} is gone"
    assert len(s.schedules.by_item) == len(s.schedules.by_name)


# -- a driver that logs what the handlers would log ---------------------------------------------

QUEUES = ("a", "b")


class Driver:
    """Makes records from the current state, as the master's handlers do (their checks
    included), without a clock (no promote_due: a replay never calls it either)."""

    def __init__(self, draw) -> None:
        self.draw = draw
        self.next_id = 1
        self.token = 1
        self.at = 100.0
        self.n_sched = 0

    def new_ids(self, n: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return ids

    def pick(self, pool, most: int = 3) -> list[int]:
        pool = sorted(pool)
        if not pool:
            return []
        return self.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=most,
                                  unique=True))

    def records(self, s: State) -> list:
        d, items, book = self.draw, s.items, s.jobs
        self.at += 1.0
        op = d(st.sampled_from(["commit", "commit", "depends", "coalesce", "result", "lease",
                                "lease", "ack", "release", "bury", "cancel", "delete",
                                "delete_queue", "purge", "redrive", "wake", "schedule",
                                "drop_schedule", "skip_missed", "progress", "forget_results",
                                "configure"]))
        jobs = [i for i, it in items.items() if not it.queue.endswith(".results")]
        leased = [i for i in jobs if items[i].status == LEASED]
        sched = s.schedules.by_item
        queue = d(st.sampled_from(QUEUES))
        if op == "commit":
            n = d(st.integers(1, 3))
            nb = d(st.sampled_from([0.0, LATER]))
            return [commit(self.new_ids(n), queue, at=self.at, not_before=nb)]
        if op == "coalesce":
            key = d(st.sampled_from(["k1", "k2"]))
            return [commit(self.new_ids(1), queue, at=self.at, keys=[key], coalesce=True)]
        if op == "depends":
            # what _check_dependencies accepts: existing live jobs, or done ones it remembers
            ok = [i for i in jobs if i not in s.origins and i not in sched
                  and i not in book.result_jobs]
            ok += [i for i in s.recent_acks if i not in items]
            parents = self.pick(ok)
            if not parents:
                return []
            for parent in parents:
                r = book.results.get(parent)
                if parent in book.recent_cancels or (r is not None and r.kind):
                    return []
            return [commit(self.new_ids(d(st.integers(1, 2))), queue, at=self.at,
                           depends_on=parents, on_failure=d(st.integers(0, 1)),
                           not_before=d(st.sampled_from([0.0, LATER])))]
        if op == "result":
            job = self.pick(leased, 1)
            if not job:
                return []
            return [commit(self.new_ids(1), items[job[0]].queue + ".results", at=self.at,
                           result_of=job, kind=d(st.integers(0, 2)), not_before=LATER)]
        if op == "lease":
            ready = [i for i in jobs if items[i].status == READY
                     and not (items[i].key and items[i].key in s.queues[items[i].queue].active)]
            ids = self.pick(ready)
            keys = [items[i].key for i in ids if items[i].key]
            if len(keys) != len(set(keys)):
                return []
            tokens = list(range(self.token, self.token + len(ids)))
            self.token += len(ids)
            return [LeaseItems(ids=ids, leases=tokens, deadline=self.at + 30, request="")] \
                if ids else []
        if op == "ack":  # Leases._ack: a schedule's item is re-armed, the others acked
            ids = self.pick(leased)
            again = [i for i in ids if i in sched]
            out = []
            if again:
                out.append(RearmItems(ids=again, not_befores=[
                    next_tick(s.schedules.of_item(i), self.at, s.schedules.of_item(i).next_at)
                    for i in again], error="", ran=True))
            rest = [i for i in ids if i not in sched]
            if rest:
                out.append(AckItems(ids=rest))
            return out
        if op == "release":  # Leases.release (a nack, or a lease that ran out)
            ids = self.pick(leased)
            rearm, rest, nbs = [], [], []
            for i in ids:
                cfg = s.config(items[i].queue)
                if s.dies(i, items[i].attempts + 1, cfg.max_attempts) and i in sched:
                    rearm.append(i)
                else:
                    rest.append(i)
                    nbs.append(d(st.sampled_from([0.0, LATER])))
            out = []
            if rearm:
                out.append(RearmItems(ids=rearm, not_befores=[LATER] * len(rearm),
                                      error="failed", ran=True))
            if rest:
                out.append(ReleaseItems(ids=rest, not_befores=nbs, error="boom"))
            return out
        if op == "bury":  # Tasks.bury
            ids = self.pick(leased)
            again = [i for i in ids if i in sched]
            rest = [i for i in ids if i not in sched]
            out = []
            if again:
                out.append(RearmItems(ids=again, not_befores=[LATER] * len(again),
                                      error="buried", ran=True))
            if rest:
                out.append(BuryItems(ids=rest, error="buried"))
            return out
        if op == "cancel":  # JobDesk.cancel's filter
            ids = [i for i in self.pick(jobs) if i not in book.cancels and i not in s.origins
                   and i not in sched and i not in book.result_jobs]
            return [CancelItems(ids=ids)] if ids else []
        if op == "delete":
            ids = self.pick(list(items))
            return [DeleteItems(ids=ids)] if ids else []
        if op == "delete_queue":
            return [DeleteQueue(queue)] if queue in s.queues else []
        if op == "purge":  # QueueAdmin.purge
            ids = [i for i, it in items.items() if it.queue == queue
                   and it.status != LEASED and i not in sched]
            return [DeleteItems(ids=ids)] if ids else []  # a purge logs deletes
        if op == "redrive":
            ids = [i for i in self.pick(list(s.origins)) if items[i].status != LEASED]
            return [RedriveItems(ids=ids)] if ids else []
        if op == "wake":  # redrive of named delayed items / beanstalkd kick
            ids = [i for i in self.pick([i for i in jobs if items[i].status == DELAYED])
                   if i not in s.origins]
            return [WakeItems(ids=ids)] if ids else []  # (waiting jobs are not woken)
        if op == "schedule":  # ScheduleDesk.set: the staged call committed, then armed
            self.n_sched += 1
            name = d(st.sampled_from(["s1", "s2", f"s{self.n_sched}"]))
            item = self.new_ids(1)
            return [commit(item, queue, at=self.at, not_before=LATER),
                    AddSchedule(name=name, queue=queue, item=item[0], cron="",
                                every_s=10.0, timezone="UTC", catch_up=False,
                                next_at=self.at + 10)]
        if op == "drop_schedule":
            names = sorted(s.schedules.by_name)
            return [DropSchedule(d(st.sampled_from(names)))] if names else []
        if op == "skip_missed":
            missed = [x for x in s.schedules.by_name.values() if x.item in items
                      and items[x.item].status != LEASED]
            return [RearmItems(ids=[x.item for x in missed],
                               not_befores=[next_tick(x, self.at, x.next_at) for x in missed],
                               error="", ran=False)] if missed else []
        if op == "progress":
            ids = self.pick(leased)
            return [ProgressItems(ids=ids, fractions=[0.5] * len(ids),
                                  notes=["n"] * len(ids),
                                  states=[d(st.sampled_from([b"", b"xy"])) for _ in ids])] \
                if ids else []
        if op == "forget_results":
            ids = self.pick(list(book.result_jobs))
            return [ForgetResults(ids=ids)] if ids else []
        if op == "configure":
            cfg = dataclasses.replace(QueueConfig(), max_attempts=d(st.sampled_from([0, 1, 2])))
            return [ConfigureQueue(queue, **cfg.as_dict())]
        raise AssertionError(op)


def through_checkpoint(state: State) -> State:
    """``state`` exported and read back as a checkpoint's body is (msgpack and all; the file
    and its fsync left out: ``checkpoint.write``/``read`` do only that around it)."""
    body = b"".join(map(codec.dumps, state.export_parts()))
    return State.restore(codec.iter_loads(body))


def run_random_history(data) -> None:
    live = State()
    resumed = State()  # the same records, but restored from a checkpoint now and then
    driver = Driver(data.draw)
    log: list[bytes] = []
    for _ in range(data.draw(st.integers(5, 60))):
        for rec in driver.records(live):
            body = records.pack(rec)
            log.append(body)
            live.apply(records.unpack(body))
            resumed.apply(records.unpack(body))
            check_invariants(live)
        if data.draw(st.integers(0, 9)) == 0:
            resumed = through_checkpoint(resumed)
    replayed = State()
    for body in log:
        replayed.apply(records.unpack(body))
    assert replayed.snapshot() == live.snapshot()
    assert resumed.snapshot() == live.snapshot()
    restored = through_checkpoint(live)
    assert restored.snapshot() == live.snapshot()
    check_invariants(restored)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_histories_replay_and_restore_the_same_and_keep_the_invariants(data):
    """Random histories of the records the handlers log (dependencies, results, cancels,
    deletes, purges, wakes, schedules, progress): the live state, its replay and its
    checkpoint agree, and the book's invariants hold."""
    run_random_history(data)


def parent_and_child(child_queue: str = "q") -> tuple[Any, list[int]]:
    """An in-process master holding a job in ``q`` and one (in ``child_queue``) waiting on it;
    the master and the two ids."""
    master = in_process_master(replication=1, min_replicas=1)
    ids = place(master, 2).ids
    report(master, ids)
    call(master, enqueue_msg(ids[:1], request="parent"))
    call(master, p.replace(enqueue_msg(ids[1:], queue=child_queue, request="child"),
                           depends_on=[ids[0]]))
    return master, ids


# -- promises a review found broken, kept now -------------------------------------------------

def test_delete_queue_with_a_waiting_job_applies_and_replays():
    """Deleting a queue that holds a job and one waiting on it applies and replays."""
    master, ids = parent_and_child()
    reply = master.handle(b"peer", 1, p.DeleteQueue("q", True), time.time(), time.monotonic())
    master.wal.flush()
    replayed = State()
    for body in master.wal.replay():
        replayed.apply(records.unpack(body))  # a restart, or a standby following the WAL
    assert not isinstance(reply, p.Error), reply
    assert not master.state.items and "q" not in master.state.queues


def test_delete_queue_with_a_dead_lettering_dependent_applies():
    """Deleting a queue deletes a waiting job that asked to be dead-lettered too; nothing is
    left half-applied."""
    s = State()
    s.apply(commit([1]))
    s.apply(commit([2], depends_on=[1], on_failure=1))
    s.apply(DeleteQueue("q"))
    assert 1 not in s.items and 2 not in s.items  # deleted with its queue, not dead-lettered
    check_invariants(s)


def test_purging_a_parent_does_not_run_what_waits_on_it():
    """A purged dependency never ran: what waits on it does not run."""
    master, ids = parent_and_child("other")
    call(master, p.Purge("q"))
    assert ids[0] not in master.state.items
    leased = call(master, p.Lease("other", 1, 30.0, 0.0, "l1", [], []))
    assert leased.ids == [], "the child ran although its parent was purged, never run"


def test_purging_a_waiting_job_does_not_free_its_own_dependents():
    """A waiting job purged before it ran does not free the jobs waiting on it."""
    s = State()
    s.apply(commit([1], "a"))
    s.apply(commit([2], "b", depends_on=[1]))
    s.apply(commit([3], "c", depends_on=[2]))
    s.apply(AckItems(ids=[2]))  # QueueAdmin.purge("b")
    assert s.head("c", 5, 200.0) == [], "job 3 runs though 2 was purged before it ran"


def test_a_cancelled_job_that_its_worker_acks_does_not_run_its_dependents():
    """A job cancelled while it ran and acked without a finished result counts as cancelled:
    the jobs waiting on it do not run."""
    s = State()
    s.apply(commit([1]))
    s.apply(commit([2], depends_on=[1]))
    s.apply(lease([1]))
    s.apply(CancelItems(ids=[1]))
    s.apply(commit([9], "q.results", result_of=[1], kind=p.RESULT_CANCELLED,
                   not_before=LATER))  # the worker's store_results
    s.apply(AckItems(ids=[1]))  # then its ack
    assert s.head("q", 5, 200.0) == [], "job 2 runs though job 1 was cancelled"


def test_a_cancelled_job_acked_without_a_kept_result_shows_cancelled():
    """Such a job shows cancelled, also when its task keeps no result."""
    master = in_process_master(replication=1, min_replicas=1)
    ids = place(master, 1).ids
    report(master, ids)
    call(master, enqueue_msg(ids))
    leased = call(master, p.Lease("q", 1, 30.0, 0.0, "lease-1", [], []))
    call(master, p.Cancel(leased.ids))
    call(master, p.Ack(leased.ids, leased.leases, False))  # result_ttl_s=0: no result stored
    assert call(master, p.Jobs(leased.ids)).states == ["cancelled"]


def test_a_named_lease_does_not_take_a_job_waiting_for_its_dependencies():
    """A named lease does not take a job waiting for its dependencies."""
    master, ids = parent_and_child()
    leased = call(master, p.Lease("q", 1, 30.0, 0.0, "l1", [], [], ids=[ids[1]]))
    assert leased.ids == [], "the child was leased before its parent ran"


def test_waking_a_job_waiting_for_its_dependencies_does_not_run_it():
    """Waking (redrive by id, beanstalkd's kick-job) does not make a waiting job ready."""
    s = State()
    s.apply(commit([1]))
    s.apply(commit([2], depends_on=[1]))
    s.apply(WakeItems(ids=[2]))
    assert s.head("q", 5, 200.0) == [1]
    check_invariants(s)


def test_a_purged_job_reads_the_same_on_a_restored_master():
    """A purge is a delete: a live master and one restored from a checkpoint say the same of
    the purged job."""
    s = State()
    s.apply(commit([1]))
    s.apply(lease([1]))
    s.apply(ReleaseItems(ids=[1], not_befores=[0.0], error="boom"))
    restored = through_checkpoint(s)
    for state in (s, restored):
        state.apply(DeleteItems(ids=[1]))  # QueueAdmin.purge("q") logs a delete
    assert restored.snapshot() == s.snapshot()
    assert 1 not in s.recent_acks, "a purged job is not done"


def test_a_parent_deleted_while_the_childs_enqueue_is_parked_does_not_let_the_child_run():
    """A dependency deleted while its dependent's enqueue waits for its data nodes fails the
    dependent when it is committed."""
    master = in_process_master(replication=1, min_replicas=1)
    ids = place(master, 2).ids
    report(master, ids[:1])
    call(master, enqueue_msg(ids[:1], request="parent"))
    parked = master.handle(b"peer", 2, p.replace(enqueue_msg(ids[1:], request="child"),
                                                 depends_on=[ids[0]]),
                           time.time(), time.monotonic())
    assert parked is None  # waits for its data node's report
    call(master, p.DeleteItem("q", ids[0], False))
    report(master, ids[1:])
    master.enqueues.serve_waiting(time.time(), time.monotonic())
    master.wal.flush()
    child = master.state.items.get(ids[1])
    assert child is None or child.status != READY, "the child runs: its parent was deleted"


def test_coalescing_a_parent_does_not_cancel_its_dependents():
    """Coalescing replaces a waiting dependency with a newer item of its key (the same work,
    later): what waited on it waits on the newer one."""
    s = State()
    s.apply(commit([1], keys=["k"]))
    s.apply(commit([2], "other", depends_on=[1]))
    s.apply(commit([3], keys=["k"], coalesce=True, at=101.0))  # replaces 1
    assert 1 not in s.items and 3 in s.items
    assert 2 in s.items, "job 2 was cancelled though the work it waits for is still queued"


def test_a_schedules_call_is_neither_leased_nor_woken_before_its_tick():
    """A schedule's call is neither leased by id nor woken before its tick (and a run that
    ended early is re-armed for the tick after)."""
    from blizzard.client.schedules import STAGED_DELAY_S

    from support.in_process_master import alloc
    master = in_process_master(replication=1, min_replicas=1)
    staged = alloc(master, 1, delays=[STAGED_DELAY_S])
    call(master, p.SetSchedule(p.ScheduleSpec("s", "q", "", 60.0, "UTC", True), staged.ids[0],
                               ["dn-a"], []))
    tick = master.state.schedules.by_name["s"].next_at
    leased = call(master, p.Lease("q", 1, 30.0, 0.0, "l1", [], [], ids=staged.ids))
    assert leased.ids == []  # not before its tick, even named
    call(master, p.Redrive("q", 1, staged.ids))  # nor woken
    assert master.state.schedules.by_name["s"].next_at == tick
    assert master.state.items[staged.ids[0]].status == 1  # still delayed until its tick
