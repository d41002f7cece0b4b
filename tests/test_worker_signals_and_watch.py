"""``@task`` jobs, the worker's signals and ``status --watch`` as a user meets them (first met in
issues 31 and 32): dead letters that read as task calls and count once, a worker that says what
a signal does and when a job dies, a watch that Ctrl-C stops however it was started, and usage
errors for what a new user types."""

from __future__ import annotations

import base64
import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from blizzard import Client
from blizzard.local.harness import free_port
from blizzard.worker.task import encode_call, format_call

from support.wait import wait_for

BLIZZARD = [sys.executable, "-m", "blizzard.cli"]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

THUMBS = '''
import pathlib, time
from blizzard import task

@task(queue="thumbs", max_attempts=2, backoff_base_s=0.05)
def always_fails(n):
    raise ValueError(f"no thumbnail for {n}")

@task(queue="naps")
def nap(tag, seconds):
    pathlib.Path(tag).write_text("started")
    time.sleep(seconds)
'''


def env_for(master: str) -> dict[str, str]:
    pythonpath = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "BLIZZARD_MASTER": master, "PYTHONPATH": pythonpath}


def cli(*args: str, master: str, cwd=None, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*BLIZZARD, *args], capture_output=True, text=True, cwd=cwd,
                          env=env_for(master), timeout=timeout_s)


class Output:
    """A child's stdout (stderr joined to it) read as it comes, each wait with a deadline."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.text = proc, ""

    def until(self, needle: str, timeout_s: float = 30.0) -> str:
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while needle not in self.text:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {needle!r} within {timeout_s} s in:\n{self.text}")
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise AssertionError(f"the process ended without {needle!r}:\n{self.text}")
                self.text += chunk.decode(errors="replace")
        return self.text

    def rest(self, timeout_s: float = 30.0) -> tuple[int, str]:
        """The exit status, and everything it printed."""
        out, _ = self.proc.communicate(timeout=timeout_s)
        self.text += out.decode(errors="replace")
        return self.proc.returncode, self.text


@pytest.fixture
def jobs_dir(tmp_path):
    (tmp_path / "myjobs.py").write_text(THUMBS)
    return tmp_path


def start_worker(jobs_dir, master: str, *args: str) -> Output:
    return Output(subprocess.Popen([*BLIZZARD, "worker", "myjobs", *args], cwd=jobs_dir,
                                   env=env_for(master), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT))


def stopped(output: Output) -> None:
    if output.proc.poll() is None:
        output.proc.kill()
        output.proc.wait()


def killed_in_a_dead_letter_queue(c: Client, queue: str, payloads: list[bytes]) -> None:
    """Enqueue ``payloads`` to ``queue`` (max_attempts 1) and fail each once: all dead."""
    c.configure_queue(queue, max_attempts=1)
    c.enqueue_many(queue, payloads)
    for msg in c.dequeue_many(queue, len(payloads)):
        msg.nack(delay_s=0, error="ValueError: boom")
    wait_for(lambda: c.stats(queue)["dead"] == len(payloads), what="the items to die")


# -- 8. dead letters of @task jobs -----------------------------------------------------------

def test_a_task_call_reads_as_python_and_anything_else_is_not_one():
    assert format_call(encode_call("always_fails", [42], {})) == "always_fails(42)"
    assert format_call(encode_call("thumb", ["a.png", b"\x00"], {"size": 128, "a b": 1})) == \
        "thumb('a.png', b'\\x00', size=128, **{'a b': 1})"
    assert format_call(b"always_fails(42)") is None
    assert format_call(b"\x94\x01") is None


def test_peek_of_a_dead_letter_queue_shows_task_calls_and_keeps_the_exact_bytes(cluster):
    m = cluster.master_addr
    call = encode_call("always_fails", [42], {})
    with Client(m, admin=True) as c:
        killed_in_a_dead_letter_queue(c, "thumbs", [call, b"raw\tbytes"])
    text = cli("queue", "peek", "thumbs.dead", "--n", "5", master=m)
    assert text.returncode == 0, text.stderr
    shown = text.stdout.splitlines()
    assert len(shown) == 2
    assert shown[0].endswith("\terror=ValueError: boom\tcall=always_fails(42)"), shown[0]
    assert "\\x94" not in text.stdout
    assert shown[1].endswith("\tdata=raw\\tbytes")  # not a call: the payload, escaped as before
    doc = json.loads(cli("queue", "peek", "thumbs.dead", "--n", "5", "--json", master=m).stdout)
    first, second = doc["items"]
    assert first["call"] == "always_fails(42)" and first["data"] is None
    assert base64.b64decode(first["data_b64"]) == call
    assert second["call"] is None and second["data"] == "raw\tbytes"


def numbers(row: str) -> list[int]:
    """The ready, delayed, leased and pending counts of a table row."""
    return [int(x) for x in row.split()[1:5]]


def test_queue_list_and_status_count_each_dead_item_once(cluster):
    m = cluster.master_addr
    with Client(m, admin=True) as c:
        killed_in_a_dead_letter_queue(c, "thumbs", [b"a", b"b"])
        c.configure_queue("mail", dead_letter="graveyard")
        killed_in_a_dead_letter_queue(c, "mail", [b"c"])
        c.enqueue("mail", b"waiting")
    listed = cli("queue", "list", master=m)
    assert listed.returncode == 0, listed.stderr
    for text in (listed.stdout, cli("status", master=m).stdout.split("queues (exact")[1]):
        lines = [line for line in text.splitlines() if line.strip()]
        header = next(i for i, line in enumerate(lines) if line.split()[0] == "queue")
        rows = {line.split()[0]: line for line in lines[header + 1:]}
        assert set(rows) >= {"thumbs", "thumbs.dead", "mail", "graveyard"}, text
        # Each item once in the numbers: three dead ones, one ready
        assert sum(sum(numbers(rows[q])) for q in rows) == 4, text
        assert numbers(rows["thumbs.dead"])[0] == 2 and numbers(rows["graveyard"])[0] == 1
        # and the queue they died in points at them
        assert rows["thumbs"].endswith("2 (counted in thumbs.dead)"), rows["thumbs"]
        assert rows["mail"].endswith("1 (counted in graveyard)"), rows["mail"]
        assert rows["thumbs.dead"].endswith("(the dead-letter queue of thumbs)")
        assert rows["graveyard"].endswith("(the dead-letter queue of mail)")
    doc = json.loads(cli("queue", "list", "--json", master=m).stdout)
    assert {q["queue"]: q["dead"] for q in doc["queues"]}["thumbs"] == 2  # its documented key
    assert "do not add" in cli("queue", "list", "--help", master=m).stdout


def test_the_worker_says_which_failure_moves_a_job_to_the_dead_letter_queue(cluster,
                                                                            jobs_dir):
    m = cluster.master_addr
    with Client(m) as c:
        c.create_queue("thumbs", max_attempts=2, backoff_base_s=0.05)
        (item,) = c.enqueue_many("thumbs", [encode_call("always_fails", [42], {})])
        worker = start_worker(jobs_dir, m, "--queues", "thumbs", "--concurrency", "1")
        try:
            worker.until("moving it to the dead-letter queue thumbs.dead")
            wait_for(lambda: c.stats("thumbs")["dead"] == 1, what="the job to die")
            worker.proc.send_signal(signal.SIGTERM)
            code, out = worker.rest()
        finally:
            stopped(worker)
    assert code == 0, out
    assert f"job {item} of thumbs failed (attempt 1 of 2): ValueError: no thumbnail" in out
    assert f"job {item} of thumbs failed (attempt 2 of 2), moving it to the dead-letter " \
           "queue thumbs.dead: ValueError: no thumbnail for 42" in out
    assert out.count("dead-letter queue") == 1
    # counts read as English
    assert "worker: 1 task (always_fails) on thumbs, 1 thread\n" in out  # of --queues
    assert "worker done: 0 jobs succeeded, 2 failed" in out


# -- 9. the worker's Ctrl-C ------------------------------------------------------------------

def test_ctrl_c_says_what_the_worker_finishes_then_what_it_left_leased(cluster, jobs_dir):
    m = cluster.master_addr
    with Client(m) as c:
        (item,) = c.enqueue_many("naps", [encode_call("nap", ["started", 60], {})])
        worker = start_worker(jobs_dir, m, "--lease-s", "3", "--concurrency", "2")
        try:
            wait_for(lambda: (jobs_dir / "started").exists(), 30, "the job to start")
            worker.proc.send_signal(signal.SIGINT)
            worker.until("SIGINT: finishing 1 job; Ctrl-C again to quit now")
            worker.proc.send_signal(signal.SIGINT)
            code, out = worker.rest()
        finally:
            stopped(worker)
        assert code == 128 + signal.SIGINT, out
        assert f"SIGINT again: quitting now; 1 job left leased [{item}]: it goes back to " \
               "its queue when its lease ends (within " in out
        # as it said
        wait_for(lambda: c.stats("naps")["ready"] == 1, 15, "the lease to run out")


def test_a_signal_with_no_job_in_hand_says_so_and_the_worker_exits_0(cluster, jobs_dir):
    worker = start_worker(jobs_dir, cluster.master_addr, "--queues", "naps")
    try:
        worker.until("worker: 1 task (nap) on naps")
        worker.proc.send_signal(signal.SIGTERM)
        code, out = worker.rest()
    finally:
        stopped(worker)
    assert code == 0, out
    assert "SIGTERM: no job to finish, exiting; another SIGTERM (or Ctrl-C) quits now" in out


# -- 12 (part). a file name for a module -----------------------------------------------------

@pytest.mark.cluster
def test_a_file_name_given_as_the_module_is_a_usage_error_naming_the_module(tmp_path):
    (tmp_path / "myjobs.py").write_text("import pathlib\npathlib.Path('imported').touch()\n")
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "tasks.py").write_text("")
    master = f"tcp://127.0.0.1:{free_port()}"  # nothing listens: it must not get that far
    for given, module in [("myjobs.py", "myjobs"), ("./myjobs.py", "myjobs"),
                          ("app/tasks.py", "app.tasks"), ("app/tasks", "app.tasks")]:
        proc = cli("worker", given, master=master, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        error = proc.stderr.strip().splitlines()[-1]
        assert error == f"Error: Invalid value for MODULES: {given} is a file; MODULES are " \
                        f"module names, as for python -m: `blizzard worker {module}`", error
    proc = cli("worker", str(tmp_path / "myjobs.py"), master=master, cwd=REPO)
    assert proc.returncode == 2 and f"`blizzard worker myjobs` in {tmp_path}" in proc.stderr
    assert not (tmp_path / "imported").exists()  # refused before running the user's code


# -- 10. status --watch and its signals; 32.13: its interval ---------------------------------

def ignore_sigint() -> None:
    """In the child before exec: SIGINT ignored, as for a job started with ``&`` in a script
    or by a CI runner (an ignored signal stays ignored across exec)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_status_watch_stops_on_a_signal_even_when_started_with_sigint_ignored(cluster, signum):
    proc = subprocess.Popen([*BLIZZARD, "status", "--watch", "0.2", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env_for(cluster.master_addr), preexec_fn=ignore_sigint)
    try:
        for _ in range(2):
            assert len(json.loads(proc.stdout.readline())["nodes"]) == 3
        proc.send_signal(signum)
        assert proc.wait(timeout=20) == 0
        assert proc.stderr.read() == b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.cluster
def test_status_watch_refuses_an_interval_that_is_not_a_finite_positive_number():
    master = f"tcp://127.0.0.1:{free_port()}"  # refused before any connection
    for interval in ("nan", "inf", "1e309", "0", "0.01"):  # nan spun, inf crashed
        proc = cli("status", f"--watch={interval}", master=master, timeout_s=20)
        assert proc.returncode == 2 and proc.stdout == "", (interval, proc.stdout[-500:])
        error = proc.stderr.strip().splitlines()[-1]
        assert error.startswith("Error: Invalid value for '--watch'") and \
            ("is not a number of seconds (finite, at least 0.1)" in error
             or "is not in the range x>=0.1" in error), error
