"""The master's job book as a state machine (master/state/job_book.py): results link to jobs and
replace each other, cancels end waiting jobs at once and leased ones when given back,
progress stays with a job across a retry; all of it replays and checkpoints the same."""

from __future__ import annotations

import time

from blizzard.wire import protocol as p
from master.state import records
from master.state.machine import State
from master.state.records import (
    AckItems,
    CancelItems,
    ForgetResults,
    LeaseItems,
    ProgressItems,
    ReleaseItems,
)

from support.in_process_master import call, enqueue_msg, in_process_master, place, report
from support.records import commit


def history() -> list:
    """Job 1 runs twice (two results), job 2 is cancelled waiting, job 3 cancelled while
    leased and given back, job 4 saves progress, fails once and keeps its state."""
    return [
        commit([1, 2, 3, 4]),
        LeaseItems(ids=[1, 3, 4], leases=[11, 13, 14], deadline=200.0, request="l1"),
        commit([50], queue="q.results", result_of=[1], not_before=1000.0),
        commit([51], queue="q.results", result_of=[1], not_before=2000.0),  # it ran again
        AckItems(ids=[1]),
        CancelItems(ids=[2, 3]),
        ReleaseItems(ids=[3], not_befores=[0.0], error="stopped"),
        ProgressItems(ids=[4], fractions=[0.5], notes=["half"], states=[b"\x91\x03"]),
        ReleaseItems(ids=[4], not_befores=[0.0], error="boom"),
    ]


def test_results_link_and_replace_cancels_end_jobs_progress_survives_a_retry():
    s = State()
    for rec in history():
        s.apply(rec)
    book = s.jobs
    assert book.results[1].item == 51 and book.results[1].runs == 2
    assert 50 not in s.items and 51 in s.items  # the first result went with its link
    assert 2 not in s.items and 2 in book.recent_cancels  # waiting: gone at once
    assert 3 not in s.items and 3 in book.recent_cancels and 3 not in book.cancels
    assert s.items[4].status != 2 and book.state_of(4) == b"\x91\x03"  # kept for the retry
    s.apply(AckItems(ids=[4]))
    assert book.state_of(4) == b"" and book.progress_bytes == 0
    s.apply(ForgetResults(ids=[51]))
    assert 1 not in book.results and 51 not in s.items


def test_the_job_book_replays_and_checkpoints_the_same():
    live = State()
    for rec in history():
        live.apply(records.unpack(records.pack(rec)))
    replayed = State()
    for rec in history():
        replayed.apply(rec)
    assert replayed.snapshot() == live.snapshot()
    again = State.restore(live.export_parts())
    assert again.snapshot() == live.snapshot()
    assert again.jobs.results[1].runs == 2 and 3 in again.jobs.recent_cancels


def test_a_cancel_of_a_leased_job_rides_on_its_next_extension():
    master = in_process_master(replication=1, min_replicas=1)
    placement = place(master, 1)
    ids = placement.ids
    report(master, ids)
    call(master, enqueue_msg(ids))
    leased = call(master, p.Lease("q", 1, 30.0, 0.0, "lease-1", [], []))
    job, lease = leased.ids[0], leased.leases[0]
    assert call(master, p.Cancel([job, 999_999])).lost == [999_999]
    extended = call(master, p.Extend([job], [lease], 30.0, progress_ids=[job], fractions=[0.25],
                                     notes=["a quarter"], states=[b"\xc0"]))
    assert extended.cancel == [job]
    seen = call(master, p.Jobs([job]))
    assert seen.states == ["running"] and seen.cancel_requested == [True]
    assert seen.progress == [0.25] and seen.notes == ["a quarter"]
    call(master, p.Nack([job], [lease], 0.0, "Cancelled"))
    assert call(master, p.Jobs([job])).states == ["cancelled"]


def test_results_queues_take_only_results_and_are_never_leased():
    master = in_process_master(replication=1, min_replicas=1)
    ids = place(master, 1).ids
    report(master, ids)
    reply = master.handle(b"peer", 1, enqueue_msg(ids, queue="q.results"), time.time(),
                          time.monotonic())
    assert isinstance(reply, p.Error) and "holds task results" in reply.message
    reply = master.handle(b"peer", 1, p.Lease("q.results", 1, 30.0, 0.0, "l", [], []),
                          time.time(), time.monotonic())
    assert isinstance(reply, p.Error) and "read, not leased" in reply.message


def chain(on_failure: int = 0) -> list:
    """A, then B waiting on A, then C waiting on B; D waits on A and on B."""
    return [commit([1]), commit([2], depends_on=[1], on_failure=on_failure),
            commit([3], depends_on=[2], on_failure=on_failure), commit([4], depends_on=[1, 2])]


def test_a_job_waits_for_its_dependencies_and_runs_when_they_are_done():
    s = State()
    for rec in chain():
        s.apply(rec)
    assert [s.items[i].status for i in (1, 2, 3, 4)] == [0, 1, 1, 1]  # ready, then waiting
    assert s.head("q", 10, 200.0) == [1]
    s.apply(LeaseItems(ids=[1], leases=[7], deadline=300.0, request=""))
    s.apply(AckItems(ids=[1]))
    assert s.head("q", 10, 200.0) == [2]  # 4 still waits for 2
    s.apply(LeaseItems(ids=[2], leases=[8], deadline=300.0, request=""))
    s.apply(AckItems(ids=[2]))
    assert s.head("q", 10, 200.0) == [3, 4]
    assert not s.jobs.waiting and not s.jobs.dependents


def test_a_failure_in_the_middle_of_a_chain_cancels_or_dead_letters_what_waits_on_it():
    s = State()
    for rec in chain():
        s.apply(rec)
    s.apply(LeaseItems(ids=[1], leases=[7], deadline=300.0, request=""))
    s.apply(AckItems(ids=[1]))
    s.apply(LeaseItems(ids=[2], leases=[8], deadline=300.0, request=""))
    s.apply(records.BuryItems(ids=[2], error="broke"))  # B dies
    assert 2 in s.origins
    assert 3 not in s.items and 4 not in s.items  # cancelled, and so would be theirs
    assert {3, 4} <= set(s.jobs.recent_cancels)
    dead = State()
    for rec in chain(on_failure=1):
        dead.apply(rec)
    dead.apply(CancelItems(ids=[1]))  # A cancelled while waiting
    assert dead.origins.get(2) == "q" and dead.origins.get(3) == "q"  # dead-lettered, in turn
    assert 4 not in dead.items  # 4 asked to be cancelled
    assert "dependency" in dead.errors[3]


def test_dependencies_replay_and_checkpoint_the_same():
    live = State()
    recs = chain() + [LeaseItems(ids=[1], leases=[7], deadline=300.0, request=""),
                      AckItems(ids=[1])]
    for rec in recs:
        live.apply(records.unpack(records.pack(rec)))
    again = State.restore(live.export_parts())
    assert again.snapshot() == live.snapshot()
    again.apply(LeaseItems(ids=[2], leases=[8], deadline=300.0, request=""))
    again.apply(AckItems(ids=[2]))
    assert again.head("q", 10, 200.0) == [3, 4]


def test_a_long_chain_fails_without_recursion():
    s = State()
    s.apply(commit([1]))
    for k in range(2, 5002):
        s.apply(commit([k], depends_on=[k - 1]))
    s.apply(CancelItems(ids=[1]))
    assert len(s.items) == 0 and len(s.jobs.recent_cancels) == 5001
