"""Shared fixtures: real clusters of processes on free loopback ports, logs shown on failure.

Each test is in a tier by the fixtures it uses and its marks (``support/tiers.py``): unit
(in-process, starts no process; ``scripts/test --fast``), cluster, spark, browser or root.
Helpers shared by test files are in ``support/``: no test file imports another.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import sys
from collections.abc import Callable, Iterator

import pytest

from blizzard.local.harness import LocalCluster, process_keys
from blizzard.local.shard_cluster import ShardedCluster
from blizzard.net.keys import ENV as BLIZZARD_KEYS

pytest_plugins = ["support.tiers", "pytester"]

if not os.environ.get(BLIZZARD_KEYS):  # one key directory for the session's clusters and clients
    atexit.register(shutil.rmtree, os.path.dirname(process_keys()), True)


@pytest.fixture
def cluster_factory(tmp_path, request) -> Iterator[Callable[..., LocalCluster]]:
    """Start ``LocalCluster``s (keyword args as LocalCluster's); all are stopped at teardown."""
    started: list[LocalCluster] = []
    with contextlib.ExitStack() as stack:
        def make(**kw) -> LocalCluster:
            base = tmp_path / f"cluster{len(started)}"
            c = LocalCluster(str(base), **kw)
            started.append(c)
            stack.callback(c.stop)
            return c.start()
        yield make
        if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
            for c in started:
                print(c.logs())


@pytest.fixture
def cluster(cluster_factory) -> LocalCluster:
    """One master and three data nodes, R=2, short heartbeats."""
    return cluster_factory(datanodes=3, heartbeat_s=0.2, dead_after_s=1.5)


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession for every test: loopback only, workers on this venv's Python."""
    from blizzard.spark import local_session

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = local_session("local[2]", app_name="blizzard-tests", shuffle_partitions=2)
    yield session
    session.stop()


@pytest.fixture
def sharded(tmp_path, request) -> Iterator[ShardedCluster]:
    """Three shards, each a master with one data node (R=1), short heartbeats."""
    with ShardedCluster(str(tmp_path / "sharded"), masters=3, datanodes=1, replication=1,
                        heartbeat_s=0.2, dead_after_s=1.5) as cluster:
        yield cluster
        if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
            print(cluster.logs())


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)

