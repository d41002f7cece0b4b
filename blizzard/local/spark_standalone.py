"""A Spark standalone cluster on loopback, from the installed pyspark: a master and workers.

For the integration test and benchmarks that must run on a real Spark cluster rather than
``local[*]``: the master and each worker are separate JVMs started from pyspark's own launch
classes (``java -cp "$SPARK_HOME/jars/*" org.apache.spark.deploy.master.Master`` and
``...worker.Worker``), with ``SPARK_HOME`` the pyspark package directory. Executors are
started by the workers, so what a Python worker needs comes from the workers' environment,
as it would on a real cluster: ``PYSPARK_PYTHON`` is the driver's choice (Spark ships it with
each job), ``PYTHONPATH`` makes ``blizzard`` importable there. Everything listens on
127.0.0.1; work directories and logs stay under ``base_dir``.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

import pyspark

from blizzard.local.harness import StartFailed, free_port
from blizzard.net.defaults import LOOPBACK
from blizzard.net.keys import ENV as KEYS_ENV

SPARK_HOME = os.path.dirname(pyspark.__file__)
# the folder holding the blizzard/ this imports: executors' PYTHONPATH
BLIZZARD_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


@dataclass
class StandaloneSpark:
    """A Spark master and ``workers`` workers on free loopback ports; ``url`` once started.

    ``daemon_heap`` is each master's and worker's own JVM heap; ``cores`` and ``memory`` are
    what each worker offers to executors (an executor asks ``spark.executor.memory``, see
    ``session_conf``).
    """

    base_dir: str
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    daemon_heap: str = "256m"
    start_timeout_s: float = 60.0
    port: int = field(default_factory=free_port)
    webui_port: int = field(default_factory=free_port)
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The master URL for ``SparkSession.builder.master`` or ``--spark-master``."""
        return f"spark://{LOOPBACK}:{self.port}"

    @property
    def status_url(self) -> str:
        return f"http://{LOOPBACK}:{self.webui_port}/json/"

    def start(self) -> StandaloneSpark:
        """Start the master, then the workers; return once every worker has registered."""
        os.makedirs(self.base_dir, exist_ok=True)
        try:
            self._launch("master", MASTER_CLASS, "--host", LOOPBACK, "--port", str(self.port),
                         "--webui-port", str(self.webui_port))
            # a worker that finds no master retries only after 5 s or more
            self._wait_until(lambda: self.alive_workers() is not None, "the Spark master")
            for n in range(self.workers):
                work = os.path.join(self.base_dir, f"worker{n}")
                os.makedirs(work, exist_ok=True)
                self._launch(f"worker{n}", WORKER_CLASS, self.url, "--host", LOOPBACK,
                             "--cores", str(self.cores), "--memory", self.memory,
                             "--webui-port", str(free_port()), "--work-dir", work)
            self._wait_until(lambda: (self.alive_workers() or 0) >= self.workers,
                             f"{self.workers} Spark workers to register")
        except BaseException:
            self.stop()
            raise
        return self

    def session_conf(self, executor_memory: str = "512m") -> dict[str, str]:
        """Settings for a session on this cluster: executors small enough to fit the workers."""
        return {"spark.executor.memory": executor_memory,
                "spark.executor.cores": str(self.cores),
                "spark.cores.max": str(self.cores * self.workers)}

    def alive_workers(self) -> int | None:
        """Workers the master counts as alive right now; None while its web UI is not up."""
        try:
            with urllib.request.urlopen(self.status_url, timeout=2) as reply:
                state = json.load(reply)
        except (urllib.error.URLError, OSError, ValueError):
            return None
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop workers (with their executors) then the master: SIGTERM to each process group,
        SIGKILL to groups still there after ``timeout_s``."""
        for proc in reversed(self.procs):
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in reversed(self.procs):
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc, signal.SIGKILL)  # executors and Python workers left behind
            proc.wait()
        self.procs.clear()

    def logs(self) -> str:
        """The daemons' logs and the executors' stderr, for a failed test."""
        parts = []
        for root, _, files in sorted(os.walk(self.base_dir)):
            for name in sorted(files):
                if name.endswith(".log") or name == "stderr":
                    path = os.path.join(root, name)
                    with open(path, "rb") as f:
                        parts.append(f"--- {path}\n{f.read()[-4000:].decode(errors='replace')}")
        return "\n".join(parts)

    def __enter__(self) -> StandaloneSpark:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _launch(self, name: str, main_class: str, *args: str) -> None:
        java = shutil.which("java", path=os.path.join(os.environ.get("JAVA_HOME", ""), "bin")
                            ) or "java"
        scratch = os.path.join(self.base_dir, "tmp")
        os.makedirs(scratch, exist_ok=True)
        argv = [java, f"-Xmx{self.daemon_heap}", f"-Djava.io.tmpdir={scratch}",
                "-cp", os.path.join(SPARK_HOME, "jars", "*"), main_class, *args]
        with open(os.path.join(self.base_dir, f"{name}.log"), "ab") as log:
            self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, env=self._env(scratch),
                                               start_new_session=True))

    def _env(self, scratch: str) -> dict[str, str]:
        """The daemons' environment, which executors and their Python workers inherit.

        As on a cluster of its own, no key directory: the driver's session hands executors
        its ``BLIZZARD_KEYS``, and its ``PYSPARK_PYTHON`` (Spark ships that with each job).
        """
        python_path = os.pathsep.join(p for p in (BLIZZARD_ROOT, os.environ.get("PYTHONPATH"))
                                      if p)
        env = {k: v for k, v in os.environ.items() if k not in (KEYS_ENV, "PYSPARK_PYTHON")}
        return dict(env, SPARK_HOME=SPARK_HOME, SPARK_SCALA_VERSION=scala_version(),
                    SPARK_LOCAL_IP=LOOPBACK, SPARK_LOCAL_DIRS=scratch, PYTHONPATH=python_path)

    def _wait_until(self, cond: Callable[[], object], what: str) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while not cond():
            exited = [p for p in self.procs if p.poll() is not None]
            if exited:
                raise StartFailed(f"a Spark daemon exited with code {exited[0].returncode} "
                                  f"while waiting for {what}", self.logs())
            if time.monotonic() > deadline:
                raise StartFailed(f"timed out after {self.start_timeout_s:.0f}s waiting for "
                                  f"{what}", self.logs())
            time.sleep(0.1)


def scala_version() -> str:
    """The Scala version pyspark's jars are built for (``2.13``): a worker's launcher needs it
    to find the jars when it builds an executor's command, and only Spark's shell scripts,
    which a pip-installed pyspark lacks in part, would set it."""
    for jar in glob.glob(os.path.join(SPARK_HOME, "jars", "spark-core_*.jar")):
        return os.path.basename(jar).split("_", 1)[1].split("-", 1)[0]
    raise StartFailed(f"no spark-core jar under {SPARK_HOME}/jars: is pyspark installed whole?")


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
