"""Hedge delays (``blizzard/net/hedge.py``): twice a node's recent p99, never more than twice
the typical node's, between the floor and the cap; the time is given."""

from __future__ import annotations

import zmq

from blizzard.client.datanodes import DatanodePool
from blizzard.net.hedge import (
    BYTES_PER_S,
    CAP_S,
    FLOOR_S,
    OWN_SAMPLES,
    HedgeDelays,
    Latencies,
)


def test_the_p99_of_the_recent_samples():
    lat = Latencies(size=100)
    for ms in range(1, 101):
        lat.add(ms / 1000)
    assert lat.p99() == 0.1
    for _ in range(100):  # the old samples leave as new ones come
        lat.add(0.002)
    assert lat.p99() == 0.002 and len(lat) == 100


def test_nothing_measured_waits_the_cap_and_a_fast_cluster_the_floor():
    delays = HedgeDelays()
    assert delays.delay_s("a") == CAP_S
    for node in "abc":
        for _ in range(50):
            delays.observe(node, 0.0005)
    assert delays.delay_s("a") == FLOOR_S
    assert delays.delay_s("a", nbytes=8_000_000) == FLOOR_S + 8_000_000 / BYTES_PER_S


def test_a_handful_of_answers_is_too_few_for_a_reader_to_hedge_on():
    # a new client's first reads: the slowest of three is no p99, so the cap until sixteen
    delays = HedgeDelays(warmup=OWN_SAMPLES)
    for _ in range(OWN_SAMPLES - 1):
        delays.observe("a", 0.001)
    assert delays.delay_s("a") == CAP_S
    delays.observe("a", 0.001)
    assert delays.delay_s("a") == FLOOR_S
    pool = DatanodePool(zmq.Context.instance(), node_timeout_s=1.0)  # a client's reads
    assert pool.delays.warmup == OWN_SAMPLES


def test_by_default_one_answer_is_enough_to_hedge_on():
    delays = HedgeDelays()  # the master's write hedge
    delays.observe("a", 0.001)
    assert delays.delay_s("a") == FLOOR_S


def test_a_node_turned_slow_does_not_teach_the_hedge_to_wait_for_it():
    # Given five nodes answering in 10-20 ms, and one that turned slow (200 ms)
    delays = HedgeDelays()
    for k, node in enumerate("abcde"):
        for _ in range(64):
            delays.observe(node, 0.010 + k * 0.0025)
    for _ in range(64):
        delays.observe("e", 0.2)
    # Then its delay is the typical node's (twice the median p99), not twice its own
    typical = delays.typical_p99()
    assert typical == 0.015
    assert delays.delay_s("e") == 2 * typical
    # and a node faster than typical is hedged sooner
    assert delays.delay_s("a") == 2 * 0.010
    assert delays.delay_s() == 2 * typical  # "": any node (the master's write hedge)
