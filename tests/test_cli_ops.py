"""Operating Blizzard from the shell, through the real command: options from ``BLIZZARD_*``
variables and a TOML config file, JSON logs, ``status --watch`` on a terminal, the age of the
status counts, shell completion, and a port in use told in one line."""

from __future__ import annotations

import io
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import click
import pytest

from blizzard import Client
from blizzard.local.harness import free_port

from support.processes import stop
from support.wait import wait_for

pytestmark = pytest.mark.cluster  # the real command, in processes of its own

BLIZZARD = [sys.executable, "-m", "blizzard.cli"]


def run(*args: str, env: dict[str, str] | None = None, timeout_s: float = 60,
        **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*BLIZZARD, *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout_s, **kw)


def options_of(command: click.Command, path: str = "blizzard"):
    """(command path, option) for every option of ``command`` and its subcommands."""
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from options_of(sub, f"{path} {name}")
    for param in command.params:
        if isinstance(param, click.Option) and param.name != "version":
            yield path, param


# -- environment variables -------------------------------------------------------------------

def test_every_option_of_every_command_has_its_blizzard_variable():
    from blizzard.cli.config import name_env_vars
    from blizzard.cli.main import cli

    name_env_vars(cli)
    shared = {"BLIZZARD_MASTER", "BLIZZARD_KEYS", "BLIZZARD_TIMEOUT_S"}
    seen = list(options_of(cli))
    assert len(seen) > 60
    for path, option in seen:
        long = next(o for o in option.opts if o.startswith("--"))
        expected = "_".join(path.upper().replace("-", "_").split()) + "_" + \
            long[2:].upper().replace("-", "_")  # (a command's hyphen too: keys export-client)
        assert option.envvar in shared | {expected}, (path, long, option.envvar)
        assert option.show_envvar
    assert ("blizzard queue stats", "BLIZZARD_QUEUE_STATS_JSON") in \
        {(path, o.envvar) for path, o in seen}


@pytest.mark.parametrize("argv", [[*BLIZZARD, "master"], [sys.executable, "-m", "master"]])
def test_the_server_variables_are_the_same_under_either_entry_point(argv):
    out = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=30).stdout
    for name in ("BLIZZARD_MASTER_DATA_DIR", "BLIZZARD_MASTER_METRICS_PORT",
                 "BLIZZARD_MASTER_LOG_FORMAT", "BLIZZARD_MASTER_CONFIG", "BLIZZARD_KEYS"):
        assert name in out.replace("\n", " ").replace("  ", ""), name


def test_options_read_from_the_environment_below_the_command_line(cluster):
    m = cluster.master_addr
    Client(m).enqueue("jobs", b"x")
    env = {"BLIZZARD_MASTER": m, "BLIZZARD_QUEUE_STATS_JSON": "1"}
    doc = json.loads(run("queue", "stats", "jobs", env=env).stdout)
    assert doc["queue"] == "jobs" and doc["ready"] == 1
    peeked = run("queue", "peek", "jobs", "--n", "5", env={**env, "BLIZZARD_QUEUE_PEEK_N": "0"})
    assert peeked.returncode == 0, peeked.stderr  # the command line's --n 5 wins over 0
    bad = run("queue", "peek", "jobs", env={**env, "BLIZZARD_QUEUE_PEEK_N": "0"})
    assert bad.returncode == 2
    assert "'--n' (env var: 'BLIZZARD_QUEUE_PEEK_N'): 0 is not" in bad.stderr
    down = run("status", env={"BLIZZARD_MASTER": f"tcp://127.0.0.1:{free_port()}",
                              "BLIZZARD_TIMEOUT_S": "0.3"}, timeout_s=20)
    assert down.returncode == 1 and "MasterUnavailable" in down.stderr


# -- the servers: config file, environment, command line; JSON logs ---------------------------

def start_server(argv: list[str], log_path, env: dict[str, str]) -> subprocess.Popen:
    """A server process, without the session's BLIZZARD_KEYS: it would outrank the config
    file's ``insecure = true`` (the environment beats the file)."""
    inherited = {k: v for k, v in os.environ.items() if k != "BLIZZARD_KEYS"}
    with open(log_path, "wb") as log:
        return subprocess.Popen([*BLIZZARD, *argv], stdout=log, stderr=subprocess.STDOUT,
                                env={**inherited, **env}, start_new_session=True)


def json_lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]




def test_server_options_from_config_file_env_and_command_line_json_logs(tmp_path):
    """Given a config file, variables and arguments for one master and one data node,
    the command line beats the environment, which beats the file, which beats defaults."""
    bind, metrics_env, metrics_cli = (f"tcp://127.0.0.1:{free_port()}", free_port(),
                                      free_port())
    (tmp_path / "master.toml").write_text(
        f'data-dir = "{tmp_path / "m"}"\nbind = "{bind}"\ninsecure = true\nreplication = 1\n'
        f'log_format = "text"\nheartbeat-s = 0.2\ndead-after-s = 2.0\n')
    master = start_server(["master", "--config", str(tmp_path / "master.toml"),
                           "--metrics-port", str(metrics_cli)], tmp_path / "master.log",
                          {"BLIZZARD_MASTER_REPLICATION": "2", "BLIZZARD_MASTER_LOG_FORMAT": "json",
                           "BLIZZARD_MASTER_METRICS_PORT": str(metrics_env)})
    (tmp_path / "node.toml").write_text(f'data_dir = "{tmp_path / "d"}"\ninsecure = true\n'
                                        f'bind = "tcp://127.0.0.1:{free_port()}"\n')
    node = start_server(["datanode", "--config", str(tmp_path / "node.toml")],
                        tmp_path / "node.log", {"BLIZZARD_MASTER": bind,
                                                "BLIZZARD_DATANODE_LOG_FORMAT": "json"})
    try:
        with Client(bind, timeout_s=20, keys="") as c:
            st = wait_for(lambda: (s := c.status()) and s.nodes and s.nodes[0].alive and s,
                          timeout_s=30, what="the data node to join")
        assert st.replication == 2 and not st.secure  # env over file; insecure from the file
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_cli}/metrics", timeout=5) as r:
            assert b"blizzard_master_items" in r.read()  # the command line's metrics port
        node_id = st.nodes[0].node_id
        serving = wait_for(lambda: [r for r in json_lines(tmp_path / "node.log")
                                    if "serving on" in r["message"]], what="the node's log")
        assert serving[0]["role"] == "datanode" and serving[0]["node_id"] == node_id
        records = json_lines(tmp_path / "master.log")
        assert {"time", "level", "logger", "message", "role", "node_id", "addr"} <= \
            set(records[0])
        assert all(r["role"] == "master" and r["addr"] == bind for r in records)
        assert any(r["level"] == "WARNING" and "SECURITY IS OFF" in r["message"]
                   for r in records)
    finally:
        stop(node)
        stop(master)


def test_a_local_cluster_logs_json_lines_when_asked(cluster_factory):
    local = cluster_factory(datanodes=1, replication=1, log_format="json")
    for proc in (local.master, local.nodes[0]):
        records = [json.loads(line) for line in open(proc.log_path) if line.strip()]
        assert records and {r["role"] for r in records} == {proc.name.rstrip("0")}


def test_a_json_log_line_carries_the_exception():
    from blizzard.server import logs

    stream = io.StringIO()
    fields = logs.ProcessFields("datanode", "tcp://127.0.0.1:5601")
    fields.node_id = "dn-1"
    handler = logging.StreamHandler(stream)
    handler.addFilter(fields)
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.getLogger("test_cli_ops.json")
    logger.addHandler(handler)
    try:
        try:
            raise ValueError("bad\nthing")
        except ValueError:
            logger.error("it failed: %s", "badly", exc_info=True)
    finally:
        logger.removeHandler(handler)
    (line,) = stream.getvalue().splitlines()
    doc = json.loads(line)
    assert doc["message"] == "it failed: badly" and doc["level"] == "ERROR"
    assert doc["node_id"] == "dn-1" and doc["role"] == "datanode"
    assert "ValueError: bad\nthing" in doc["exception"] and doc["time"].endswith("Z")


@pytest.mark.parametrize("toml, error", [
    ("replicaton = 3\n", "unknown key 'replicaton' (known: advertise, bind, checkpoint_records"),
    ('replication = "3"\n', "replication = '3': expected an integer"),
    ("replication = 30\n", "replication = 30: 30 is not in the range 1<=x<=9"),
    ("insecure = 1\n", "insecure = 1: expected true or false"),
    ("bind = 'localhost:1'\n", "bind = 'localhost:1': 'localhost:1' is not an address"),
    ("replication = \n", "is not valid TOML"),
])
def test_a_bad_config_file_is_one_line_and_changes_nothing(tmp_path, toml, error):
    config = tmp_path / "c.toml"
    config.write_text(f'data-dir = "{tmp_path / "m"}"\n' + toml)
    proc = run("master", "--config", str(config))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"Error: config {config}") and error in proc.stderr
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "m").exists()


def test_keys_and_insecure_from_the_same_source_are_refused(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(f'data-dir = "{tmp_path / "m"}"\nkeys = "{tmp_path}"\ninsecure = true\n')
    proc = run("master", "--config", str(config), env={"BLIZZARD_KEYS": ""}, timeout_s=20)
    assert proc.returncode == 2 and "give either --keys or --insecure, not both" in proc.stderr


# -- a port in use -----------------------------------------------------------------------------

@pytest.mark.parametrize("role, argv", [
    ("master", ["master", "--bind"]),
    ("data node", ["datanode", "--bind"]),
    ("metrics", ["datanode", "--metrics-port"]),
])
def test_a_port_in_use_is_one_clear_line(tmp_path, role, argv):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        value = str(port) if role == "metrics" else f"tcp://127.0.0.1:{port}"
        args = [*argv, value, "--data-dir", str(tmp_path / "x"), "--insecure"]
        if argv[0] == "datanode" and role == "metrics":
            args += ["--bind", f"tcp://127.0.0.1:{free_port()}"]
        proc = run(*args)
    assert proc.returncode == 1
    (line,) = proc.stderr.splitlines()
    if role == "metrics":
        assert line == f"Error: cannot serve metrics on 127.0.0.1:{port}: Address already in use"
    else:
        assert line == (f"Error: cannot listen on tcp://127.0.0.1:{port}: Address already in "
                        f"use — is another {role} running? (choose another port with --bind)")
    if role == "master":
        assert not (tmp_path / "x").exists()  # stopped before it touched a WAL


def test_a_cluster_on_a_port_in_use_is_one_clear_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run("cluster", "--data-dir", str(tmp_path), "--datanodes", "1", "--port",
                   str(port), "--node-port", str(free_port()), "--no-metrics")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"Error: the master's port {port} on 127.0.0.1 is taken (Address "
                           "already in use): is another cluster running there?")
    assert proc.stdout == ""  # no banner, no "stopped": the cluster never served


def test_a_second_master_on_a_data_dir_in_use_is_one_clear_line(cluster):
    data_dir = os.path.join(cluster.base_dir, "master")
    proc = run("master", "--data-dir", data_dir, "--bind", f"tcp://127.0.0.1:{free_port()}",
               "--insecure")
    assert proc.returncode == 1
    (line,) = proc.stderr.splitlines()
    assert line == (f"Error: the WAL in {data_dir}/wal is in use by another process (is a "
                    "master already running on this data dir?)")
    assert len(cluster.status().nodes) == 3  # the running master was not disturbed


def test_a_second_data_node_on_a_store_in_use_is_one_clear_line(cluster):
    store = os.path.join(cluster.base_dir, "datanode0")
    proc = run("datanode", "--data-dir", store, "--bind", f"tcp://127.0.0.1:{free_port()}",
               "--master", cluster.master_addr, "--insecure")
    assert proc.returncode == 1
    (line,) = proc.stderr.splitlines()
    assert line.startswith("Error: the store in ") and "is in use by another process" in line
    assert len(cluster.status().nodes) == 3


# -- status: the age of its counts, --watch ----------------------------------------------------

def test_status_counts_say_their_age(cluster):
    m = cluster.master_addr
    Client(m).enqueue_many("jobs", [b"a", b"b", b"c"])
    env = {"BLIZZARD_MASTER": m}

    def replicated():  # R=2: the heartbeats have told the master of every copy
        doc = json.loads(run("status", "--json", env=env).stdout)
        return sum(n["items"] for n in doc["nodes"]) == 6 and doc
    doc = wait_for(replicated, what="the heartbeats to count every copy")
    assert all(0 <= n["heartbeat_age_s"] < 1.5 for n in doc["nodes"])  # heartbeat_s=0.2
    assert doc["queues"][0]["ready"] == 3
    text = run("status", env=env).stdout
    assert "items and bytes as of heartbeats" in text and "queues (exact" in text
    rows = [line for line in text.splitlines() if line.strip().startswith("dn-")]
    assert len(rows) == 3 and all(" s ago " in row for row in rows)


def read_until(fd: int, predicate, timeout_s: float = 30.0) -> bytes:
    """Read a pseudo-terminal until ``predicate(everything read)`` holds."""
    got = b""
    deadline = time.monotonic() + timeout_s
    while not predicate(got):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out; the terminal showed {got[-2000:]!r}")
        if select.select([fd], [], [], left)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the other side closed
                chunk = b""
            if not chunk:
                raise AssertionError(f"the terminal closed; it showed {got[-2000:]!r}")
            got += chunk
    return got


def test_status_watch_redraws_in_place_on_a_terminal_and_ctrl_c_ends_it(cluster):
    Client(cluster.master_addr).enqueue("watched", b"x")
    controller, terminal = os.openpty()
    proc = subprocess.Popen([*BLIZZARD, "status", "--watch", "0.3"], stdin=terminal,
                            stdout=terminal, stderr=terminal, start_new_session=True,
                            env={**os.environ, "BLIZZARD_MASTER": cluster.master_addr})
    os.close(terminal)
    try:
        home_clear = b"\x1b[H\x1b[2J"
        shown = read_until(controller, lambda got: got.count(home_clear) >= 2
                           and got.rsplit(home_clear, 1)[1].count(b"watched") == 1)
        first, second = shown.split(home_clear)[1:3]
        for screen in (first, second):
            assert b"every 0.3 s; Ctrl-C stops" in screen and b"watched" in screen
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
        rest = b""
        try:
            while select.select([controller], [], [], 0.5)[0]:
                chunk = os.read(controller, 65536)
                if not chunk:
                    break
                rest += chunk
        except OSError:  # the terminal is closed once the process is gone
            pass
        assert b"Traceback" not in shown + rest and b"aborted" not in shown + rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(controller)


def test_status_watch_into_a_pipe_prints_snapshots_and_json_lines(cluster):
    env = {**os.environ, "BLIZZARD_MASTER": cluster.master_addr}
    proc = subprocess.Popen([*BLIZZARD, "status", "--watch", "0.2", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        lines = [json.loads(proc.stdout.readline()) for _ in range(2)]
        assert all(len(doc["nodes"]) == 3 for doc in lines)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
        assert b"\x1b" not in proc.stdout.read() and proc.stderr.read() == b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_queue_exists_error_names_a_command_that_works(cluster):
    env = {"BLIZZARD_MASTER": cluster.master_addr}
    assert run("queue", "create", "made", env=env).returncode == 0
    again = run("queue", "create", "made", env=env)
    assert again.returncode == 1 and "(QueueExists)" in again.stderr
    suggested = again.stderr.split("`")[1].split()  # blizzard queue config made --OPTION VALUE
    assert suggested[:4] == ["blizzard", "queue", "config", "made"]
    changed = run(*suggested[1:4], "--max-attempts", "7", "--json", env=env)
    assert changed.returncode == 0 and json.loads(changed.stdout)["max_attempts"] == 7


# -- shell completion --------------------------------------------------------------------------

@pytest.mark.parametrize("shell, marker", [("bash", "complete -o nosort -F _blizzard_completion"),
                                           ("zsh", "#compdef blizzard"),
                                           ("fish", "complete --no-files --command blizzard")])
def test_the_completion_script_comes_from_the_command(shell, marker):
    proc = run(env={"_BLIZZARD_COMPLETE": f"{shell}_source"})
    assert proc.returncode == 0 and marker in proc.stdout


def test_completion_completes_commands_and_options():
    env = {"_BLIZZARD_COMPLETE": "bash_complete", "COMP_WORDS": "blizzard queue st",
           "COMP_CWORD": "2"}
    assert run(env=env).stdout.split() == ["plain,stats"]
    env.update(COMP_WORDS="blizzard status --w", COMP_CWORD="2")
    assert "plain,--watch" in run(env=env).stdout.split()
