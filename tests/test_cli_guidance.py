"""What the command line tells a user (first met in issues 31 and 32): the demo cleans up after
itself and says what to do next, plain ``dequeue`` leases instead of deleting, ``blizzard
cluster`` says where the status page is and prints nothing about stopping what never started,
and inputs that would run away are usage errors."""

from __future__ import annotations

import json
import os
import queue
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading

import pytest

from blizzard import Client
from blizzard.local.harness import free_port

pytestmark = pytest.mark.cluster  # the real command, in processes of its own

BLIZZARD = [sys.executable, "-m", "blizzard.cli"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "scripts")
NOWHERE = "tcp://127.0.0.1:1"  # nothing listens: a command that got that far would wait


def blizzard(*args: str, master: str = NOWHERE, env: dict[str, str] | None = None,
             timeout_s: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*BLIZZARD, *args], capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "BLIZZARD_MASTER": master, **(env or {})}, **kw)


def one_usage_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    """Exit 2, no traceback, and one `Error:` line naming ``words``."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("Error:")]
    for word in words:
        assert word in line, (word, line)


# -- 7: plain dequeue leases --------------------------------------------------------------------

def test_plain_dequeue_leases_and_prints_the_token_labelled_and_ack_deletes(cluster):
    m = cluster.master_addr
    first, second, third = blizzard("enqueue", "jobs", "one", "two", "three",
                                    master=m).stdout.split()
    # When a user dequeues without options
    proc = blizzard("dequeue", "jobs", master=m)
    # Then the item is leased, not deleted, and the line names its id and token
    assert proc.returncode == 0, proc.stderr
    fields = proc.stdout.rstrip("\n").split("\t")
    assert fields[0] == f"id={first}" and fields[2] == "data=one"
    assert fields[1].startswith("token=") and int(fields[1].removeprefix("token=")) > 0
    with Client(m) as c:
        assert (c.stats("jobs")["leased"], c.stats("jobs")["ready"]) == (1, 2)
    # And JSON names the token the same way
    doc = json.loads(blizzard("dequeue", "jobs", "--json", master=m).stdout)
    (item,) = doc["items"]
    assert doc["acked"] is False and item["id"] == int(second)
    assert isinstance(item["token"], int) and "lease" not in item
    # and that token acks it
    assert blizzard("ack", "jobs", second, str(item["token"]), master=m).returncode == 0
    # And --ack deletes at once, printing no token
    acked = blizzard("dequeue", "jobs", "--ack", master=m)
    assert acked.stdout == f"id={third}\tdata=three\n"
    with Client(m) as c:
        assert (c.stats("jobs")["leased"], c.stats("jobs")["ready"]) == (1, 0)  # only `one`


def test_dequeue_help_says_the_default_leases_and_what_changed():
    text = " ".join(blizzard("dequeue", "--help").stdout.split())
    assert "--ack / --no-ack" in text and "default: no-ack]" in text
    assert "used to be the default" in text and "CHANGELOG" in text
    with open(os.path.join(ROOT, "CHANGELOG.md")) as f:
        changelog = f.read()
    assert "dequeue" in changelog and "--ack" in changelog and '"token"' in changelog


# -- 32.13: inputs that run away ----------------------------------------------------------------

def _limit_memory() -> None:  # an unbounded read fails here instead of filling the machine
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_enqueue_of_an_endless_file_or_stdin_stops_at_the_largest_item(tmp_path):
    one_usage_error(blizzard("enqueue", "q", "--file", "/dev/zero", timeout_s=30,
                             preexec_fn=_limit_memory), "/dev/zero", "16 MiB")
    with open("/dev/zero", "rb") as zero:
        one_usage_error(blizzard("enqueue", "q", "-", stdin=zero, timeout_s=30,
                                 preexec_fn=_limit_memory), "stdin", "16 MiB")


def test_a_priority_outside_32_bits_is_a_usage_error():
    one_usage_error(blizzard("enqueue", "q", "x", "--priority", "99999999999999999999999"),
                    "--priority", "2147483647")
    one_usage_error(blizzard("enqueue", "q", "x", "--priority", "-2147483649"), "--priority")


@pytest.mark.parametrize("value", ["nan", "1e309", "inf", "-1", "86400000"])
def test_a_timeout_that_is_not_a_sane_number_of_seconds_is_a_usage_error(value):
    # from the environment, as a user's shell would set it, and from the option
    one_usage_error(blizzard("status", env={"BLIZZARD_TIMEOUT_S": value}, timeout_s=20),
                    "--timeout-s", "BLIZZARD_TIMEOUT_S")
    one_usage_error(blizzard("dequeue", "q", "--timeout-s", value, timeout_s=20), "--timeout-s")


@pytest.mark.parametrize("argv", [["enqueue", "q", "x", "--delay-s"], ["dequeue", "q", "--wait-s"],
                                  ["dequeue", "q", "--lease-s"]])
def test_other_durations_of_nan_or_forever_are_usage_errors(argv):
    for value in ("nan", "1e309"):
        one_usage_error(blizzard(*argv, value, timeout_s=20), argv[-1])


@pytest.mark.parametrize("argv", [
    ["nack", "q", "1", "1", "--delay-s"], ["extend", "q", "1", "1", "--lease-s"],
    ["dashboard", "--interval-s"], ["dispatch", "q", "--lease-s"], ["worker", "m", "--lease-s"],
    ["master", "--data-dir", "unused", "--heartbeat-s"],
    ["datanode", "--data-dir", "unused", "--heartbeat-s"]])
def test_every_duration_option_refuses_nan_and_infinity(argv):
    """Open-ended ranges too: ``--heartbeat-s inf`` is not a duration."""
    one_usage_error(blizzard(*argv, "nan", timeout_s=20), argv[-1], "finite")
    one_usage_error(blizzard(*argv, "inf", timeout_s=20), argv[-1])


# -- 12: blizzard cluster -----------------------------------------------------------------------

@pytest.mark.parametrize("masters", ["1", "2"])
def test_cluster_names_the_status_page_once_it_serves(tmp_path, masters):
    data = tmp_path / "cluster"
    proc = subprocess.Popen([*BLIZZARD, "cluster", "--data-dir", str(data), "--insecure",
                             "--masters", masters, "--datanodes", "1", "--port",
                             str(free_port()), "--node-port", str(free_port()), "--no-metrics"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    try:
        seen = [lines.get(timeout=60)]
        while "status page" not in seen[-1]:
            seen.append(lines.get(timeout=60))
        if masters == "1":  # one data node: R defaults to 1, so an item goes round
            with Client(seen[0].split()[1].rstrip(","), keys="") as c:
                item = c.enqueue("one", b"x")
                msg = c.dequeue("one")
                assert msg is not None and msg.id == item
                msg.ack(wait=True)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "blizzard dashboard" in seen[-1] and "http://127.0.0.1:8080/" in seen[-1], seen
    assert proc.returncode == 0 and lines.get(timeout=10) == "stopped\n"
    # what it made is the user's alone: the data directory, the logs
    assert data.stat().st_mode & 0o777 == 0o700
    logs = list(data.rglob("*.log"))
    assert logs and {log.stat().st_mode & 0o777 for log in logs} == {0o600}


def test_cluster_refuses_more_copies_than_data_nodes(tmp_path):
    one_usage_error(blizzard("cluster", "--data-dir", str(tmp_path), "--datanodes", "1",
                             "--replication", "2"), "--replication", "at least 2 data nodes")
    assert not os.listdir(tmp_path)  # nothing started, nothing made


def test_sharded_cluster_on_a_port_in_use_prints_no_stopped(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = blizzard("cluster", "--data-dir", str(tmp_path), "--masters", "2", "--datanodes",
                        "1", "--port", str(port), "--node-port", str(free_port()),
                        "--no-metrics")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"port {port}" in proc.stderr and "is taken" in proc.stderr
    assert proc.stdout == ""  # it never ran: nothing was stopped


# -- 6 and 11: the demo ------------------------------------------------------------------------

def test_the_demo_leaves_nothing_in_tmp_and_says_what_to_do_next(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "BLIZZARD_KEYS"}  # as a user's shell
    proc = subprocess.run([sys.executable, "scripts/demo.py", "--items", "200", "--jobs", "20",
                           "--no-spark"], cwd=ROOT, env={**env, "TMPDIR": str(tmp)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "lost: 0" in proc.stdout and proc.stderr == ""
    assert os.listdir(tmp) == []  # no blizzard-keys-*, no data, no job files
    # and it says how to get the command and what to try with it
    steps = proc.stdout[proc.stdout.index("Next"):]
    assert "source .venv/bin/activate" in steps or "pip install" in steps
    for command in ("blizzard cluster --data-dir", "blizzard enqueue", "blizzard dequeue",
                    "blizzard ack", "blizzard dashboard", "http://127.0.0.1:8080/"):
        assert command in steps, command


def test_a_process_keys_directory_goes_with_its_process(tmp_path):
    """Benches, chaos runs and scripts start clusters with ``process_keys()``: the secret keys
    it makes in the temp dir are removed when the process ends."""
    env = {k: v for k, v in os.environ.items() if k != "BLIZZARD_KEYS"}
    proc = subprocess.run([sys.executable, "-c", "from blizzard.local.harness import process_keys; "
                           "import os; print(sorted(os.listdir(process_keys())))"],
                          env={**env, "TMPDIR": str(tmp_path)}, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "client.key_secret" in proc.stdout, proc.stderr
    assert os.listdir(tmp_path) == []


def test_the_demo_keeps_the_jvms_notices_off_the_terminal(tmp_path):
    """The Spark step's JVM writes its start-up notices (incubator modules, log4j's profile,
    the default log level, native-hadoop) into a log, not onto the demo's stderr."""
    log = tmp_path / "spark.log"
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from spark_drain_demo import with_spark; "
            "print(with_spark(sys.argv[2], 'local[1]', 't', lambda s: s.range(3).count()))")
    proc = subprocess.run([sys.executable, "-c", code, SCRIPTS, str(log)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "3\n" and proc.stderr == ""
    assert "incubator" in log.read_text()  # the JVM did say it: into the log


def test_venv_setup_keeps_pip_quiet_and_shows_its_log_only_on_failure(tmp_path):
    """``scripts/_venv.sh`` against a stand-in interpreter that prints what pip and
    setuptools print (the real install takes minutes and would change .venv)."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(os.path.join(SCRIPTS, "_venv.sh"), tmp_path / "scripts")
    for name in ("setup.cfg", "pyproject.toml"):
        (tmp_path / name).write_text("[x]\n")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\necho 'Obtaining file:///x'\n"
                      "echo 'DEPRECATION: Building with the legacy setup.py bdist_wheel' >&2\n"
                      "echo 'SetuptoolsDeprecationWarning: License classifiers' >&2\n"
                      "exit ${FAKE_PIP_EXIT:-0}\n")
    python.chmod(0o755)
    script = f"EXTRAS=spark source {tmp_path}/scripts/_venv.sh && echo ready"

    ok = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr
    assert ok.stdout.splitlines()[-1] == "ready" and "DEPRECATION" not in ok.stdout
    assert len(ok.stdout.splitlines()) == 2  # one line saying it installs, then ours

    for stamp in (tmp_path / ".venv").glob(".installed-*"):
        stamp.unlink()
    failed = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                            env={**os.environ, "FAKE_PIP_EXIT": "1"})
    assert failed.returncode == 1 and "ready" not in failed.stdout
    assert "failed" in failed.stderr and "DEPRECATION" in failed.stderr  # the log, shown
