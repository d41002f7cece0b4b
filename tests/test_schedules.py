"""Schedules (master/jobs/schedules.py, blizzard/wire/cron.py): cron ticks computed right (in
timezones, across daylight-saving changes), each tick enqueued exactly once across a master
kill -9 and a standby's takeover (checked in the WAL, not only by timing), missed ticks caught
up or skipped, one schedule however many workers declare it, and clear refusals."""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from itertools import pairwise

import pytest

from blizzard import Client
from blizzard.wire import cron
from blizzard.wire import protocol as p
from blizzard.wire.errors import Forbidden, InvalidArgument, UnknownItem
from blizzard.worker.task import encode_call, task
from master.log.inspect import armed_ticks
from master.state import records
from master.state.records import AddSchedule, RearmItems
from master.state.schedule_book import Schedule, next_tick

from support.records import commit
from support.together import in_threads
from support.wait import wait_for
from support.worker_proc import running_worker

UTC = dt.UTC


def at(*fields: int, tz: str = "UTC") -> float:
    from zoneinfo import ZoneInfo
    return dt.datetime(*fields, tzinfo=ZoneInfo(tz)).timestamp()


# -- cron, in process ----------------------------------------------------------------------

def test_cron_ticks_follow_the_fields_the_timezone_and_daylight_saving():
    start = at(2026, 11, 27, 1, 40, 30)
    assert cron.next_after(cron.parse("*/5 * * * *"), start) == at(2026, 11, 27, 1, 45)
    assert cron.next_after(cron.parse("*/10 * * * * *"), start) == at(2026, 11, 27, 1, 40, 40)
    assert cron.next_after(cron.parse("0 9 * * mon"), start) == at(2026, 11, 30, 9)
    assert cron.next_after(cron.parse("0 0 29 feb *"), start) == at(2028, 2, 29)
    # Vixie cron: both day fields restricted, either matches (the 1st, or a Friday)
    assert cron.next_after(cron.parse("0 0 1 * fri"), start) == at(2026, 12, 1)  # a Tuesday
    berlin = cron.parse("30 9 * * *")
    assert cron.next_after(berlin, start, "Europe/Berlin") == at(2026, 11, 27, 9, 30,
                                                                  tz="Europe/Berlin")
    # 02:30 does not exist in Berlin on 2026-03-29 (clocks jump 02:00 -> 03:00): skipped
    skipped = cron.next_after(cron.parse("30 2 * * *"), at(2026, 3, 28, 12), "Europe/Berlin")
    assert skipped == at(2026, 3, 30, 2, 30, tz="Europe/Berlin")
    # 02:30 happens twice on 2026-10-25 (03:00 -> 02:00): it fires once
    first = cron.next_after(cron.parse("30 2 * * *"), at(2026, 10, 24, 12), "Europe/Berlin")
    again = cron.next_after(cron.parse("30 2 * * *"), first, "Europe/Berlin")
    assert again - first > 23 * 3600


@pytest.mark.parametrize("bad, says", [
    ("* * *", "has 3 fields"), ("61 * * * *", "minute '61'"), ("* * 31 2 *", "never fires"),
    ("*/0 * * * *", "step"), ("5-1 * * * *", "runs backwards"), ("* * * * funday", "day of week"),
])
def test_a_bad_cron_expression_is_refused_saying_why(bad, says):
    with pytest.raises(InvalidArgument, match=says):
        cron.parse(bad)
    with pytest.raises(InvalidArgument, match=says):
        task("q", cron=bad)(lambda: None)


def test_an_unknown_timezone_and_a_double_or_missing_spec_are_refused():
    with pytest.raises(InvalidArgument, match="unknown timezone 'Mars/Olympus'"):
        task("q", cron="* * * * *", timezone="Mars/Olympus")(lambda: None)
    with pytest.raises(InvalidArgument, match="one of them"):
        task("q", cron="* * * * *", every_s=5)(lambda: None)
    with pytest.raises(InvalidArgument, match="every_s"):
        task("q", every_s=0.5)(lambda: None)
    with pytest.raises(InvalidArgument, match="overlap=True is not offered"):
        task("q", every_s=5, overlap=True)(lambda: None)


def test_every_n_seconds_keeps_to_its_grid_and_skips_ticks_a_long_run_overlapped():
    s = Schedule("s", "q", 1, "", 10.0, "UTC", True, next_at=1000.0)
    assert next_tick(s, 1003.0, s.next_at) == 1010.0  # a short run: the next tick
    assert next_tick(s, 1045.5, s.next_at) == 1050.0  # ran 45 s: the ticks meanwhile skipped


def test_schedules_replay_and_checkpoint_the_same():
    from master.state.machine import State
    live = State()
    recs = [commit([1]), AddSchedule("s", "q", 1, "", 5.0, "UTC", True, 1005.0),
            records.LeaseItems(ids=[1], leases=[9], deadline=2000.0, request=""),
            RearmItems(ids=[1], not_befores=[1010.0], error="", ran=True)]
    for rec in recs:
        live.apply(records.unpack(records.pack(rec)))
    s = live.schedules.by_name["s"]
    assert (s.next_at, live.schedules.runs["s"], live.delays[1], live.items[1].attempts) == \
        (1010.0, 1, 1010.0, 0)
    assert live.recent_acks[1] == 9  # a retried ack of that run is answered done
    again = State.restore(live.export_parts())
    assert again.snapshot() == live.snapshot()
    live.apply(records.DeleteItems(ids=[1]))  # its item deleted: the schedule ends
    assert not live.schedules.by_name


# -- a real cluster ------------------------------------------------------------------------

JOBS = '''
import os, pathlib, time
import blizzard
from blizzard.worker.task import task

OUT = pathlib.Path(os.environ["JOBS_OUT"])

@task(queue="ticks", every_s=1.0)
def heartbeat():
    (OUT / f"tick-{blizzard.current_tick():.3f}-{time.time_ns()}").write_text("")

@task(queue="crons", cron="* * * * * *", catch_up=False)
def every_second():
    (OUT / f"cron-{blizzard.current_tick():.3f}-{time.time_ns()}").write_text("")
'''


@pytest.fixture
def jobs_dir(tmp_path):
    (tmp_path / "jobs.py").write_text(JOBS)
    (tmp_path / "out").mkdir()
    return tmp_path


def runs(jobs_dir, prefix: str) -> list[float]:
    """The ticks the task ran for (a tick may run twice: at least once), in order."""
    return sorted(float(name.split("-")[1]) for name in os.listdir(jobs_dir / "out")
                  if name.startswith(prefix + "-"))


def test_each_tick_is_enqueued_once_across_a_master_kill(cluster_factory, jobs_dir):
    cluster = cluster_factory(datanodes=2, heartbeat_s=0.2, dead_after_s=1.5)
    with running_worker(jobs_dir, cluster.master_addr, "--queues", "ticks,crons"):
        wait_for(lambda: len(runs(jobs_dir, "tick")) >= 3 and len(runs(jobs_dir, "cron")) >= 3,
                 30, "three ticks of each schedule")
        cluster.master.kill()  # kill -9, mid-schedule
        cluster.restart_master()
        before = {k: len(runs(jobs_dir, k)) for k in ("tick", "cron")}
        wait_for(lambda: all(len(runs(jobs_dir, k)) >= n + 3 for k, n in before.items()), 30,
                 "three more ticks of each")
    with Client(cluster.master_addr) as c:
        schedules = {s.name: s for s in c.schedules()}
    for name, prefix in (("heartbeat", "tick"), ("every_second", "cron")):
        s = schedules[name]
        armed = armed_ticks(os.path.join(cluster.base_dir, "master", "wal"), s.job)
        assert len(armed) == len(set(armed)) and armed == sorted(armed)  # never a tick twice
        assert all(b - a >= 1.0 - 1e-6 for a, b in pairwise(armed))  # a second apart
        ran = runs(jobs_dir, prefix)
        assert set(ran) <= {round(t, 3) for t in armed}  # every run is for a tick armed once
        assert s.runs >= 6


def test_a_standby_takes_over_the_schedule_and_arms_no_tick_twice(cluster_factory, jobs_dir):
    cluster = cluster_factory(standby=True, heartbeat_s=0.2, dead_after_s=1.5, datanodes=2)
    wait_for(lambda: "replies now wait for it" in cluster.master.head(), 30, "the standby")
    with running_worker(jobs_dir, cluster.masters, "--queues", "ticks"):
        wait_for(lambda: len(runs(jobs_dir, "tick")) >= 2, 30, "two ticks to run")
        cluster.master.kill()
        wait_for(lambda: "promoted" in cluster.second.head(), 30, "the standby's promotion")
        before = len(runs(jobs_dir, "tick"))
        wait_for(lambda: len(runs(jobs_dir, "tick")) >= before + 3, 40,
                 "ticks from the new primary")
    with Client(cluster.masters) as c:
        (s,) = c.schedules(["heartbeat"])
    armed = armed_ticks(os.path.join(cluster.base_dir, "standby", "wal"), s.job)
    assert len(armed) == len(set(armed)) and armed == sorted(armed)
    assert set(runs(jobs_dir, "tick")) <= {round(t, 3) for t in armed}


def test_a_tick_missed_while_no_master_ran_runs_once_or_is_skipped(cluster_factory, jobs_dir):
    cluster = cluster_factory(datanodes=2, heartbeat_s=0.2, dead_after_s=1.5)
    with running_worker(jobs_dir, cluster.master_addr, "--queues", "ticks,crons"):
        wait_for(lambda: len(runs(jobs_dir, "cron")) >= 2 and len(runs(jobs_dir, "tick")) >= 2,
                 30, "both schedules to run")
        cluster.master.kill()
        stopped = time.time()
        time.sleep(3.0)  # three ticks pass with no master: what is tested, not a wait
        restarted = time.time()
        cluster.restart_master()
        wait_for(lambda: any(t > restarted for t in runs(jobs_dir, "cron")) and
                 any(t > restarted for t in runs(jobs_dir, "tick")), 30,
                 "ticks after the restart")
    skipped = [t for t in runs(jobs_dir, "cron") if stopped + 0.5 < t < restarted]
    assert not skipped, f"ticks missed while no master ran were run: {skipped}"
    with Client(cluster.master_addr) as c:
        (heartbeat,) = c.schedules(["heartbeat"])
    armed = armed_ticks(os.path.join(cluster.base_dir, "master", "wal"), heartbeat.job)
    missed = [t for t in armed if stopped < t < restarted]
    assert len(missed) <= 1  # catch_up: the tick armed when the master died, and no other
    assert all(round(t, 3) in runs(jobs_dir, "tick") for t in missed)  # ... runs once back


def test_eight_workers_declaring_one_schedule_make_one(cluster):
    payload = encode_call("heartbeat", [], {})
    made: list[int] = []
    barrier = threading.Barrier(8)

    def declare() -> None:
        with Client(cluster.master_addr) as c:
            barrier.wait()
            made.append(c.schedule("one", "ticks", payload, every_s=60).job)

    in_threads(lambda k: declare(), 8, timeout_s=30)
    with Client(cluster.master_addr) as c:
        (s,) = c.schedules(["one"])
        assert s.every_s == 60 and s.state == "delayed"
        assert c.stats("ticks")["delayed"] == 1  # one item: the others' calls were dropped
        with pytest.raises(Forbidden, match="needs an admin key"):
            c.schedule("one", "ticks", payload, every_s=30)  # a client key may not change it
    with Client(cluster.master_addr, admin=True) as admin:
        changed = admin.schedule("one", "ticks", payload, every_s=30)  # an admin may
        assert changed.every_s == 30 and admin.stats("ticks")["delayed"] == 1
    with Client(cluster.master_addr) as c:
        with pytest.raises(UnknownItem):
            c.master.call(p.SetSchedule(p.ScheduleSpec("two", "ticks", "", 5.0, "UTC", True),
                                        424242, [], []))
        with pytest.raises(InvalidArgument, match="unknown timezone"):
            c.schedule("three", "ticks", payload, cron="* * * * *", timezone="Nowhere/City")
        with pytest.raises(Forbidden, match="admin key"):
            c.remove_schedule("one")  # a client key may declare, not remove
    with Client(cluster.master_addr, admin=True) as admin:
        assert admin.remove_schedule("one") and not admin.schedules()
        assert admin.stats("ticks")["delayed"] == 0
        assert not admin.remove_schedule("one")
