"""``@task`` and ``blizzard worker``: unit tests of the pieces, then a real worker process
against a real cluster (success, retry and dead letter, SIGTERM, a hard stop, burst mode)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types

import pytest

from blizzard import Client, InvalidArgument, ProtocolError, configure
from blizzard.wire.codec import dumps
from blizzard.worker.context import JobContext
from blizzard.worker.loop import Prefetch
from blizzard.worker.runner import run_job
from blizzard.worker.task import Task, decode_call, encode_call, settings_of, task, tasks_in

from support.wait import wait_for
from support.worker_proc import BLIZZARD, finish, start_worker

# The module the worker runs; the test enqueues through stand-ins of the same names.
JOBS = '''
import os, pathlib, time
from blizzard.worker.task import task

OUT = pathlib.Path(os.environ["JOBS_OUT"])

@task(queue="work", max_attempts=3, backoff_base_s=0.4)
def record(tag, suffix=""):
    (OUT / f"ok-{tag}{suffix}").write_text("done")

@task(queue="work")
def fail(tag):
    with open(OUT / f"attempts-{tag}", "a") as f:
        f.write(f"{time.monotonic()}\\n")
    raise ValueError(f"bad thing {tag}")

@task(queue="slow")
def slow(tag, seconds):
    (OUT / f"started-{tag}").write_text("")
    time.sleep(seconds)
    (OUT / f"done-{tag}").write_text("")
'''


@task(queue="work", max_attempts=3, backoff_base_s=0.4)
def record(tag: str, suffix: str = "") -> None: ...


@task(queue="work")
def fail(tag: str) -> None: ...


@task(queue="slow")
def slow(tag: str, seconds: float) -> None: ...


# -- units -------------------------------------------------------------------------------------

def test_a_call_round_trips_and_anything_else_is_a_clear_protocol_error():
    data = encode_call("make_thumbnail", ("a.png",), {"size": 128})
    assert decode_call(data) == ("make_thumbnail", ["a.png"], {"size": 128})
    with pytest.raises(ProtocolError, match="not a task call"):
        decode_call(b"\x93\x01\x02\x03")
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        decode_call(b"\xc1garbage")
    with pytest.raises(ProtocolError, match="name"):
        decode_call(dumps([1, 7, [], {}]))
    with pytest.raises(InvalidArgument, match="msgpack types"):
        encode_call("x", (object(),), {})


def test_a_task_checks_its_queue_and_settings_and_still_runs_locally():
    assert record("a") is None and record.name == "record" and record.queue == "work"
    assert record.settings == {"max_attempts": 3, "backoff_base_s": 0.4}
    with pytest.raises(InvalidArgument, match="max_attempts"):
        task("q", max_attempts=-1)(lambda: None)
    with pytest.raises(InvalidArgument, match="unknown queue option"):
        task("q", retries=3)(lambda: None)
    with pytest.raises(InvalidArgument, match="queue name"):
        task("no spaces")(lambda: None)
    with pytest.raises(InvalidArgument, match="a call is a tuple of arguments"):
        record.enqueue_many([5])  # refused before any connection is made
    with pytest.raises(InvalidArgument, match="msgpack types"):
        record.enqueue({1, 2})


def test_tasks_are_found_in_modules_and_must_agree_on_their_queues_settings():
    mod = types.ModuleType("m")
    mod.record, mod.fail, mod.other = record, fail, 42
    assert tasks_in([mod]) == {"record": record, "fail": fail}
    assert settings_of([record, fail], "work") == {"max_attempts": 3, "backoff_base_s": 0.4}
    mod.clash = task("work", name="clash", max_attempts=5)(lambda: None)
    with pytest.raises(InvalidArgument, match="disagree on max_attempts"):
        tasks_in([mod])
    twin = types.ModuleType("t")
    twin.a, twin.b = task("q", name="same")(lambda: 1), task("q", name="same")(lambda: 2)
    with pytest.raises(InvalidArgument, match="two tasks are named 'same'"):
        tasks_in([twin])


def test_a_job_outcome_says_success_failure_or_poison():
    seen = []
    ok = Task(lambda x, y=0: seen.append((x, y)), "q", "ok", {})
    bad = Task(lambda: 1 / 0, "q", "bad", {})
    tasks = {"ok": ok, "bad": bad}

    def msg(data: bytes) -> types.SimpleNamespace:
        return types.SimpleNamespace(data=data, attempts=0)
    done = run_job(tasks, JobContext(msg(encode_call("ok", [1], {"y": 2}))))
    assert done.error == "" and seen == [(1, 2)] and done.result  # None, kept as a result
    failed = run_job(tasks, JobContext(msg(encode_call("bad", [], {}))))
    assert failed.error.startswith("ZeroDivisionError: division by zero (at ") and not failed.poison
    unknown = run_job(tasks, JobContext(msg(encode_call("nope", [], {}))))
    assert unknown.poison and "unknown task 'nope'" in unknown.error and "bad, ok" in unknown.error
    garbage = run_job(tasks, JobContext(msg(b"raw bytes")))
    assert garbage.bury and not garbage.poison
    assert garbage.error.startswith("undecodable task payload")
    wrong_shape = run_job(tasks, JobContext(msg(dumps([1, "ok", "not a list", {}]))))
    assert wrong_shape.bury and wrong_shape.error.startswith("undecodable task payload")
    assert not unknown.bury  # another worker may know the name: retried, not buried
    wrong_args = run_job(tasks, JobContext(msg(encode_call("ok", [1, 2, 3], {}))))
    assert wrong_args.error.startswith("TypeError") and not wrong_args.poison


def test_the_prefetch_is_a_tenth_of_a_second_of_work_by_the_recent_job_length():
    pre = Prefetch(8, buffer_s=0.1, cap=2000)
    assert pre.target() == 0  # nothing known yet: one job per thread
    pre.record(0.01)
    assert pre.target() == 80  # 8 threads x 0.1 s / 10 ms
    pre.record(0.000001)
    assert pre.target() == 88  # a moving average: one quick job changes little
    for _ in range(200):
        pre.record(0.000001)
    assert pre.target() == 2000  # no-op jobs: capped
    for _ in range(200):
        pre.record(2.0)
    assert pre.target() == 0  # long jobs: none held beyond the running ones


# -- a real worker process ---------------------------------------------------------------------

@pytest.fixture
def jobs_dir(tmp_path):
    (tmp_path / "jobs.py").write_text(JOBS)
    (tmp_path / "out").mkdir()
    return tmp_path


def out_files(jobs_dir, prefix: str) -> list[str]:
    return sorted(p.name for p in (jobs_dir / "out").iterdir() if p.name.startswith(prefix))


def test_jobs_run_and_are_acked_and_burst_mode_exits_when_the_queue_is_empty(cluster, jobs_dir):
    configure(master=cluster.master_addr)  # the default client of enqueue
    try:
        first = record.enqueue("a")
    finally:
        configure()
    with Client(cluster.master_addr) as c:
        assert c.queue_config("work")["max_attempts"] == 3  # the first enqueue created it
        record.with_options(client=c).enqueue_many([("b",), {"tag": "c"},
                                                     (("d",), {"suffix": "!"})])
        slow.with_options(client=c).enqueue("z", 0)  # another queue: the worker serves both
        assert isinstance(first.id, int) and first == first.id  # a handle equals its id
        code, out = finish(start_worker(jobs_dir, cluster.master_addr, "--burst",
                                        "--concurrency", "3"))
        assert code == 0, out
        assert out_files(jobs_dir, "ok-") == ["ok-a", "ok-b", "ok-c", "ok-d!"]
        assert out_files(jobs_dir, "done-") == ["done-z"]
        assert "5 jobs succeeded, 0 failed" in out
        for queue in ("work", "slow"):
            stats = c.stats(queue)
            assert (stats["ready"], stats["leased"], stats["delayed"], stats["dead"]) == \
                (0, 0, 0, 0)


def test_a_failing_job_is_retried_after_its_back_off_then_dead_lettered_with_its_error(
        cluster, jobs_dir):
    with Client(cluster.master_addr) as c:
        record.with_options(client=c).enqueue("first")  # creates "work" with the task's settings
        fail.with_options(client=c).enqueue("x")
        proc = start_worker(jobs_dir, cluster.master_addr)
        try:
            wait_for(lambda: c.stats("work")["dead"] == 1, 20, "the failing job to die")
        finally:
            proc.send_signal(signal.SIGTERM)
            code, out = finish(proc)
        assert code == 0, out
        times = [float(t) for t in (jobs_dir / "out" / "attempts-x").read_text().split()]
        assert len(times) == 3  # max_attempts
        assert times[1] - times[0] >= 0.4 * 0.9 and times[2] - times[1] >= 0.8 * 0.9  # back-off
        assert out_files(jobs_dir, "ok-") == ["ok-first"]
    with Client(cluster.master_addr, admin=True) as admin:
        dead = admin.peek("work.dead", 10)
        assert len(dead) == 1 and dead[0].attempts == 3
        assert dead[0].error.startswith("ValueError: bad thing x (at ")
        assert decode_call(dead[0].data) == ("fail", ["x"], {})


def test_an_unknown_task_dies_after_its_attempts_and_a_foreign_payload_at_once(cluster,
                                                                               jobs_dir):
    with Client(cluster.master_addr) as c:
        record.with_options(client=c).enqueue("before")
        c.enqueue("work", encode_call("no_such_task", [1], {}))
        c.enqueue("work", b"not a task call")
        record.with_options(client=c).enqueue("after")
        proc = start_worker(jobs_dir, cluster.master_addr)
        try:
            wait_for(lambda: c.stats("work")["dead"] == 2, 20, "both undoable jobs to die")
            wait_for(lambda: len(out_files(jobs_dir, "ok-")) == 2, 10, "the good jobs")
        finally:
            proc.send_signal(signal.SIGTERM)
            code, out = finish(proc)
        assert code == 0, out
    with Client(cluster.master_addr, admin=True) as admin:
        dead = sorted((m.error, m.attempts) for m in admin.peek("work.dead", 10))
        assert dead[0][0].startswith("undecodable task payload") and dead[0][1] == 1  # buried
        assert dead[1][0].startswith("unknown task 'no_such_task': this worker runs fail, "
                                     "record, slow")
        assert dead[1][1] == 3  # the queue's max_attempts: another worker might have known it


def test_sigterm_during_a_job_lets_it_finish_acks_it_and_exits_0(cluster, jobs_dir):
    with Client(cluster.master_addr) as c:
        slow.with_options(client=c).enqueue("s", 1.5)
        proc = start_worker(jobs_dir, cluster.master_addr, "--queues", "slow")
        wait_for(lambda: out_files(jobs_dir, "started-"), 20, "the job to start")
        proc.send_signal(signal.SIGTERM)
        code, out = finish(proc)
        assert code == 0, out
        assert out_files(jobs_dir, "done-") == ["done-s"]
        stats = c.stats("slow")
        assert (stats["ready"], stats["leased"], stats["delayed"]) == (0, 0, 0)  # acked


def test_a_second_signal_stops_at_once_and_the_job_comes_back(cluster, jobs_dir):
    with Client(cluster.master_addr) as c:
        slow.with_options(client=c).enqueue("h", 30)
        proc = start_worker(jobs_dir, cluster.master_addr, "--queues", "slow", "--lease-s", "2")
        wait_for(lambda: out_files(jobs_dir, "started-"), 20, "the job to start")
        time.sleep(2.5)  # longer than the lease: only extensions keep it
        assert c.stats("slow")["leased"] == 1 and c.stats("slow")["ready"] == 0
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGINT)  # Python may handle either first
        code, out = finish(proc, 10)
        assert code in (128 + signal.SIGINT, 128 + signal.SIGTERM), out
        assert out_files(jobs_dir, "done-") == []
        wait_for(lambda: c.stats("slow")["ready"] == 1, 10, "the lease to run out")
        again = c.dequeue("slow")
        assert again is not None and again.attempts == 1
        assert decode_call(again.data) == ("slow", ["h", 30], {})


def test_usage_errors_are_one_line_and_exit_2(cluster, jobs_dir):
    for args, text in [(["no_such_module"], "cannot import no_such_module"),
                       (["jobs", "--queues", "elsewhere"], "no task of jobs uses queue(s) "
                                                           "elsewhere"),
                       (["jobs", "--queues", "bad name"], "not valid")]:
        proc = subprocess.run([*BLIZZARD, "worker", *args, "--master", cluster.master_addr],
                              cwd=jobs_dir, capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, JOBS_OUT=str(jobs_dir / "out")))
        assert proc.returncode == 2 and text in proc.stderr, proc.stderr


@pytest.mark.cluster
def test_the_worker_bench_prints_the_raw_client_and_the_worker_side_by_side():
    proc = subprocess.run([sys.executable, "-m", "bench.worker", "--n", "300", "--batch", "50",
                           "--concurrency", "2"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(x["op"], x["n"], x["capped"]) for x in lines] == \
        [("raw_dequeue_ack", 300, False), ("worker", 300, False)]
    assert lines[1]["concurrency"] == 2 and lines[1]["vs_raw"] > 0
    assert lines[1]["worker_cpu_us_per_job"] > 0


def test_a_worker_serves_every_shard_of_a_sharded_queue(sharded, jobs_dir):
    spec = " ".join(sharded.addrs)
    with Client(spec) as c:
        tags = [f"s{i}" for i in range(12)]
        ids = [record.with_options(client=c).enqueue(tag) for tag in tags]  # random shards
        assert len({i >> 56 for i in ids}) > 1
        fail.with_options(client=c).enqueue("x")
        proc = start_worker(jobs_dir, spec)
        try:
            wait_for(lambda: len(out_files(jobs_dir, "ok-")) == 12 and c.stats("work")["dead"] == 1,
                     30, "every shard's jobs done, the failing one dead")
        finally:
            proc.send_signal(signal.SIGTERM)
            code, out = finish(proc)
        assert code == 0, out
        assert out_files(jobs_dir, "ok-") == sorted(f"ok-{t}" for t in tags)
        stats = c.stats("work")
        assert (stats["ready"], stats["leased"]) == (0, 0)
