"""A client process's ZeroMQ context keeps working whatever its endpoints go through
(scenarios in ``zmq_wedge.py``, each in a process of its own: a stopped context hangs)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cluster  # each scenario in a process of its own

HERE = os.path.dirname(os.path.abspath(__file__))


def run_scenario(name: str) -> tuple[str, int]:
    env = {**os.environ, "PYTHONPATH": os.path.dirname(HERE)}
    done = subprocess.run([sys.executable, os.path.join(HERE, "support", "zmq_wedge.py"), name],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    outcome, events = done.stdout.split()
    return outcome, int(events)


def test_endpoints_dropped_mid_handshake_leave_the_context_working():
    assert run_scenario("dropped") == ("works", 0)


def test_thousands_of_unread_handshake_events_leave_the_context_working():
    outcome, events = run_scenario("unread")
    assert outcome == "works"
    assert events > 2_000  # past where ZeroMQ's default limit stopped its I/O thread
