"""The figures of ``scripts/bench --faults`` computed from recorded times (no processes)."""

from __future__ import annotations

import pytest

from bench.faults import (
    Calls,
    Window,
    bin_table,
    bins,
    fewest_ready,
    longest_gap,
    window_figures,
    windows_for,
)

pytestmark = pytest.mark.unit


def test_the_longest_gap_counts_the_window_edges_as_bounds():
    times = [0.1, 0.2, 3.0, 3.1, 9.5]
    assert longest_gap(times, 0.0, 10.0) == pytest.approx((6.4, 3.1))
    assert longest_gap(times, 0.0, 3.0) == pytest.approx((2.8, 0.2))
    assert longest_gap(times, 3.05, 9.0) == pytest.approx((5.9, 3.1))  # to the window's end


def test_no_event_in_a_window_is_a_stall_of_all_of_it():
    assert longest_gap([], 5.0, 10.0) == (5.0, 5.0)
    assert longest_gap([1.0, 11.0], 5.0, 10.0) == (5.0, 5.0)


def test_bins_count_each_time_once_and_drop_times_past_the_end():
    assert bins([0.0, 0.49, 0.5, 1.9, 2.0, -0.1], 2.0) == [2, 1, 0, 1]
    assert len(bins([], 25.0)) == 50


def test_the_pause_window_ends_a_second_after_sigcont_but_not_past_the_kill():
    assert windows_for(25, 5, 5, 15) == [Window("fault_free", 0, 5), Window("pause", 5, 11),
                                         Window("kill", 15, 25)]
    assert windows_for(10, 2, 2, 4.5)[1] == Window("pause", 2, 4.5)


def test_a_window_reports_its_stalls_and_the_latencies_of_calls_done_in_it():
    enq = Calls(done=[(4.9, 5.0), (5.0, 9.5), (9.5, 9.6)], errors=[(6.0, "x")])
    deq = Calls(done=[(4.0, 4.1)])
    f = window_figures(Window("pause", 5.0, 11.0), enq, deq, backlog=2)
    assert f["enqueues"] == 3 and f["enqueue_errors"] == 1
    assert (f["no_enqueue_s"], f["no_enqueue_from_s"]) == (4.5, 5.0)
    assert f["enqueue_max_ms"] == 4500.0
    assert (f["dequeues"], f["no_dequeue_s"], f["dequeue_ack_p99_ms"]) == (0, 6.0, None)
    assert f["ready_min"] == 2 + 1 - 1  # one acked enqueue and one dequeue before the window


def test_the_fewest_ready_follows_enqueues_and_dequeues_through_the_window():
    enq, deq = [1.0, 2.0, 6.0], [1.5, 3.0, 4.0, 5.0]
    assert fewest_ready(enq, deq, 2, 0.0, 10.0) == 0  # 2, 3, 2, 3, 2, 1, 0, 1
    assert fewest_ready(enq, deq, 2, 2.5, 3.5) == 2
    assert fewest_ready([], [], 7, 0.0, 1.0) == 7
    assert fewest_ready([2.0], [1.0], 0, 0.0, 3.0) == 0  # dequeued before its enqueue returned


def test_the_table_marks_the_bins_where_faults_began():
    table = bin_table([1] * 12, [2] * 12, {10: "P"})
    lines = table.splitlines()
    assert len(lines) == 3 and lines[2].startswith("    5.0 |     1P")
