"""Tiers of tests: a pytest plugin (``conftest.py`` loads it) that puts each test in its tier,
keeps the unit tier free of processes, and fails any skip.

The tiers are markers, registered in setup.cfg:

- ``cluster``: starts processes (a master and data nodes, the CLI, a script);
- ``spark``: runs Spark (a local session's JVM, or a standalone Spark cluster);
- ``browser``: drives the status page in headless Chromium;
- ``root``: needs root (network namespaces);
- ``unit``: none of these: in-process, what ``scripts/test --fast`` runs (``-m unit``).

A test lands in its tier without thought: by the fixtures it uses, directly or through other
fixtures (``TIER_OF_FIXTURE``), or by a marker it or its module carries (``pytestmark`` in a file
that starts processes another way). A test may be in several (a Spark test on a real cluster).

Two checks keep the tiers honest, in any run:

- a unit test that starts a process (``subprocess``, ``multiprocessing``, ``os.fork``,
  ``os.system``, ``os.posix_spawn``) fails, naming the command: it is in the wrong tier, and
  ``--fast`` would be slow and not in-process;
- a skipped test fails (a strict ``xfail`` stays as it is): the suite must not pass by leaving
  something out, and a tier is chosen with ``-m``, which deselects, never skips.

After a run, one line gives the number of tests and their time in each tier.
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

TIERS = ("cluster", "spark", "browser", "root")
UNIT = "unit"

TIER_OF_FIXTURE = {
    "cluster": "cluster",
    "cluster_factory": "cluster",
    "sharded": "cluster",
    "spark": "spark",
    "spark_cluster": "spark",  # test_spark_standalone.py's Spark master and workers
    "browser": "browser",  # test_dashboard_page.py's headless Chromium
}

# Every way a Python process starts another, and which argument is the command: subprocess
# goes through fork_exec (its own reference) or os.posix_spawn, multiprocessing's spawn and
# forkserver through fork_exec, its fork through os.fork.
SPAWNERS = {(subprocess, "_fork_exec"): 0, (_posixsubprocess, "fork_exec"): 0, (os, "fork"): None,
            (os, "forkpty"): None, (os, "posix_spawn"): 1, (os, "posix_spawnp"): 1,
            (os, "system"): 0}

STARTED = pytest.StashKey[list]()


class ProcessInUnitTest(Exception):
    """Raised when a test of the unit tier starts a process."""


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for name in getattr(item, "fixturenames", ()):
            if name in TIER_OF_FIXTURE:
                item.add_marker(TIER_OF_FIXTURE[name])
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(UNIT)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if item.get_closest_marker(UNIT) is None:
        return (yield)
    with no_processes(item.stash.setdefault(STARTED, [])):
        return (yield)


@contextlib.contextmanager
def no_processes(started: list[str]) -> Iterator[None]:
    """While open, starting a process raises ``ProcessInUnitTest`` and is noted in ``started``
    (noted too in case the code under test swallows the exception)."""
    saved = [(module, name, getattr(module, name)) for module, name in SPAWNERS
             if getattr(module, name, None) is not None]
    for module, name, _ in saved:
        setattr(module, name, refuse(module, name, started))
    try:
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


def refuse(module: Any, name: str, started: list[str]) -> Callable[..., Any]:
    """A stand-in for ``module.name`` that notes the command and raises."""
    command_at = SPAWNERS[module, name]

    def started_a_process(*args: Any, **kwargs: Any) -> Any:
        command = args[command_at] if command_at is not None and len(args) > command_at else ""
        started.append(f"{module.__name__}.{name}({command!r})")
        raise ProcessInUnitTest(f"a unit test started a process: {started[-1]}")
    return started_a_process


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    report = yield
    report.tiers = "+".join(t for t in (*TIERS, UNIT) if item.get_closest_marker(t))
    if report.skipped and not hasattr(report, "wasxfail"):
        fail_the_skip(report)
    started = item.stash.get(STARTED, None)
    if started:
        message = (f"{item.nodeid} is a unit test (it uses none of the tiers' fixtures and has "
                   f"no tier marker) but it started a process: {'; '.join(started)}. Put it in "
                   "its tier: use the cluster fixtures, or mark it or its module "
                   "(pytestmark = pytest.mark.cluster).")
        started.clear()
        if report.passed:
            report.outcome = "failed"
            report.longrepr = message
        else:
            report.sections.append(("tiers", message))
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    report = yield
    if report.skipped:
        fail_the_skip(report)
    return report


def fail_the_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    where = report.nodeid
    if isinstance(report.longrepr, tuple):  # (path, line, "Skipped: reason")
        path, line, reason = report.longrepr
        where = f"{path}:{line}: {reason}"
    report.outcome = "failed"
    report.longrepr = (f"skipped: {where}\nThe suite allows no skip: a test that cannot run "
                       "here must fail, saying what it needs.")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TierClock(), "tier-clock")


class TierClock:
    """The number of tests and their time (set-up, call, teardown) in each tier or set of
    tiers ("cluster+spark"), printed after the run: how long each tier takes."""

    def __init__(self) -> None:
        self.times: dict[str, list] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        times = self.times.setdefault(getattr(report, "tiers", "?"), [0, 0.0])
        times[0] += report.when == "call" or (report.when == "setup" and not report.passed)
        times[1] += report.duration

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.times:
            terminalreporter.write_line("time by tier (summed over workers): " + ", ".join(
                f"{tiers} {n} tests {s:.0f} s" for tiers, (n, s) in sorted(self.times.items())))
