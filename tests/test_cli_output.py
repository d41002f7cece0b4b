"""How the CLI prints: payload escaping and JSON fields, figures with units (no processes)."""

from __future__ import annotations

import base64

from blizzard.cli.common import master_origin
from blizzard.cli.output import escape, payload, seconds, shown_stats, size
from blizzard.cli.queue import _status_doc, _status_lines
from blizzard.wire import protocol as p
from blizzard.wire.queue_settings import SETTINGS


def test_payloads_print_on_one_line_and_as_json_fields():
    assert escape(b"plain") == "plain"
    assert escape(b"a\tb\nc\rd\\e") == "a\\tb\\nc\\rd\\\\e"
    assert escape(b"\xff\\x") == "\\xff\\\\x"  # a real backslash is told from an escape
    assert escape("é".encode()) == "é"
    assert payload(b"hi") == {"data_b64": "aGk=", "data": "hi"}
    raw = payload(b"\xff\x00")
    assert raw["data"] is None and base64.b64decode(raw["data_b64"]) == b"\xff\x00"


def test_figures_are_rounded_with_units():
    assert seconds(0.5903642177581787) == "0.6 s"
    assert seconds(42.4) == "42 s" and seconds(600) == "10.0 min" and seconds(None) == "-"
    assert seconds(3 * 3600) == "3.0 h" and seconds(3 * 86400) == "3.0 d"
    assert size(512) == "512 B" and size(1536) == "1.5 KiB" and size(20 << 20) == "20 MiB"
    stats = {"queue": "q", "ready": 0, "delayed": 0, "leased": 0, "pending": 0, "dead": 0,
             "oldest_age_s": 0.0}
    assert shown_stats(stats)["oldest_age_s"] is None


def test_the_master_address_origin_is_explained():
    assert "--master" in master_origin(["status", "--master", "tcp://h:1"], {})
    assert "--master" in master_origin(["status", "--master=tcp://h:1"], {})
    assert "BLIZZARD_MASTER" in master_origin(["status"], {"BLIZZARD_MASTER": "tcp://h:1"})
    assert "default" in master_origin(["status"], {})


def test_status_shows_safe_mode_and_the_queue_totals():
    settings = p.QueueSettings(**{s.name: s.default for s in SETTINGS})
    jobs = p.QueueStats("jobs", 3, 0, 1, 0, 0, 2.5, 40, 36, settings)
    starting = p.ClusterStatus([], [jobs], 0, 3, True, True)
    doc = _status_doc(starting)
    assert doc["safe_mode"] is True
    assert (doc["queues"][0]["enqueued_total"], doc["queues"][0]["acked_total"]) == (40, 36)
    assert any(line.startswith("safe mode: ON (the master just started")
               for line in _status_lines(starting))
    settled = p.ClusterStatus([], [jobs], 0, 3, True, False)
    assert _status_doc(settled)["safe_mode"] is False
    assert "safe mode: off" in _status_lines(settled)


def test_status_of_a_sharded_cluster_names_the_shards_that_do_not_answer():
    st = p.ClusterStatus([], [], 0, 2, True, False)
    doc = {**_status_doc(st), "shards": 3, "shards_unanswered": {"1": "MasterUnavailable: gone"}}
    assert "shards: 3, NOT ANSWERING: 1 (shard 1: MasterUnavailable: gone); shown: the others" \
        in _status_lines(st, doc)
    assert "shards: 3, all answering" in _status_lines(st, {**doc, "shards_unanswered": {}})
    assert not any(line.startswith("shards:") for line in _status_lines(st))  # one master
