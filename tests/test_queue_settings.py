"""Queue settings, defined once: what derives from them, their checks, and old bytes that must
load."""

from __future__ import annotations

import dataclasses
import math

import click
import msgpack
import pytest

from blizzard.cli.queue import queue_config, queue_create
from blizzard.wire import protocol as p
from blizzard.wire import queue_settings
from blizzard.wire.errors import InvalidArgument, VersionMismatch
from blizzard.wire.queue_settings import NAMES, SETTINGS, Settings, check_changes
from master.state import records
from master.state.machine import State
from master.state.queue_config import QueueConfig

# Written by the code before the settings had one definition; the bytes must keep decoding.
OLD_CONFIGURE_RECORD = bytes.fromhex(
    "996ca46a6f6273cb400400000000000003ab6a6f62732e6661696c6564cb3fd0000000000000cb404e00000000"
    "0000cb405900000000000007")
OLD_CONFIGURE_FRAME = bytes.fromhex(
    "9c011b05a46a6f6273c3cb4004000000000000c0ab6a6f62732e6661696c6564c0cb404e000000000000c007")
OLD_SETTINGS_FRAME = bytes.fromhex(
    "9a011a06cb400400000000000003ab6a6f62732e6661696c6564cb3fd0000000000000cb404e000000000000cb40"
    "5900000000000007")
JOBS = dict(lease_s=2.5, max_attempts=3, dead_letter="jobs.failed", backoff_base_s=0.25,
            backoff_cap_s=60.0, rate_per_s=100.0, burst=7)


def test_every_shape_that_holds_the_settings_takes_them_from_the_one_definition():
    def names(cls) -> tuple[str, ...]:
        if dataclasses.is_dataclass(cls):
            return tuple(f.name for f in dataclasses.fields(cls))
        return p.fields_of(cls)

    assert NAMES == ("lease_s", "max_attempts", "dead_letter", "backoff_base_s", "backoff_cap_s",
                     "rate_per_s", "burst", "attributes", "paused_until",
                     "result_ttl_s")  # the on-disk order: append only
    assert names(p.QueueSettings) == NAMES
    assert names(p.Configure) == ("queue", "create", *NAMES)
    assert names(records.ConfigureQueue) == ("queue", *NAMES)
    assert names(QueueConfig) == NAMES and issubclass(QueueConfig, Settings)
    assert QueueConfig.option_names() == list(NAMES)
    cli_options = {o.name: o for o in queue_config.params if isinstance(o, click.Option)}
    assert [n for n in cli_options if n in NAMES] == list(NAMES)
    assert all(cli_options[s.name].help.startswith(s.help) for s in SETTINGS)
    assert [o.name for o in queue_create.params if o.name in NAMES] == list(NAMES)


def test_the_defaults_lie_within_their_bounds():
    assert QueueConfig().validate() == QueueConfig()
    assert QueueConfig().as_dict() == {s.name: s.default for s in SETTINGS}


def test_an_old_wal_record_still_loads_and_configures_the_queue():
    rec = records.unpack(OLD_CONFIGURE_RECORD)  # written before `attributes` existed
    assert rec == records.ConfigureQueue("jobs", **JOBS)
    assert rec.attributes == ""
    again = records.pack(rec)  # written now: the old fields in their places, the new one after
    assert again[1:len(OLD_CONFIGURE_RECORD)] == OLD_CONFIGURE_RECORD[1:]
    assert records.unpack(again) == rec
    state = State()
    state.apply(rec)
    assert state.config("jobs") == QueueConfig(**JOBS)


def _as_version_2(frame: bytes) -> bytes:
    version, op, rid, *fields = msgpack.unpackb(frame)
    assert version == 1
    return msgpack.packb([p.VERSION, rid, [op, *fields]])


def test_version_1_frames_are_refused_and_their_fields_keep_their_order_in_version_2():
    for frame in (OLD_CONFIGURE_FRAME, OLD_SETTINGS_FRAME):
        with pytest.raises(VersionMismatch, match="version 1"):
            p.decode(frame)
    assert p.decode(_as_version_2(OLD_CONFIGURE_FRAME)) == (5, p.Configure(
        "jobs", True, lease_s=2.5, max_attempts=None, dead_letter="jobs.failed",
        backoff_base_s=None, backoff_cap_s=60.0, rate_per_s=None, burst=7))
    assert p.decode(_as_version_2(OLD_SETTINGS_FRAME)) == (6, p.QueueSettings(**JOBS))


def test_a_checkpoint_with_positional_queue_settings_still_restores():
    header = [100_000, 0, {}, [], [], [["jobs", 2.5, 3, "jobs.failed", 0.25, 60.0, 100.0, 7]],
              [], 0]
    assert State.restore([header]).config("jobs") == QueueConfig(**JOBS)


def test_changes_are_checked_and_numbers_normalised():
    assert check_changes({"lease_s": 5, "burst": 2, "dead_letter": None}) == \
        {"lease_s": 5.0, "burst": 2}
    assert type(check_changes({"lease_s": 5})["lease_s"]) is float
    assert check_changes({}) == {}


@pytest.mark.parametrize("options, message", [
    ({"visibility": 3}, "unknown queue option(s) visibility; valid: lease_s, max_attempts, "
                        "dead_letter, backoff_base_s, backoff_cap_s, rate_per_s, burst"),
    ({"lease_s": 0}, "lease_s must be a number in [0.001, 43200], got 0"),
    ({"lease_s": math.nan}, "lease_s must be a number"),
    ({"lease_s": "10"}, "lease_s must be a number"),
    ({"max_attempts": -1}, "max_attempts must be an integer in [0, 1e+06], got -1"),
    ({"max_attempts": True}, "max_attempts must be an integer"),
    ({"max_attempts": 2.0}, "max_attempts must be an integer"),
    ({"burst": "ten"}, "burst must be an integer in [0, 1e+06], got 'ten'"),
    ({"dead_letter": 5}, "dead_letter must be a string of at most 200 characters"),
    ({"dead_letter": "d" * 201}, "dead_letter must be a string"),
    ({"rate_per_s": math.inf}, "rate_per_s must be a number"),
])
def test_bad_changes_are_refused_with_a_clear_message(options, message):
    with pytest.raises(InvalidArgument) as caught:
        check_changes(options)
    assert message in caught.value.message


def test_a_message_class_may_not_declare_a_setting_itself():
    with pytest.raises(TypeError, match="lease_s"):
        @queue_settings.with_settings()
        class Twice:
            lease_s: float


def test_valid_queue_names_are_remembered_boundedly_and_invalid_ones_never():
    """Every request names its queue, so a name found valid is remembered (issue 35: the
    check was a regex per request); a flood of new names cannot grow that memory."""
    from blizzard.wire import queue_settings as qs
    from blizzard.wire.errors import InvalidArgument
    qs._VALID_NAMES.clear()
    assert qs.check_queue_name("jobs.results") == "jobs.results"
    assert "jobs.results" in qs._VALID_NAMES
    for bad in ("", "has space", "x" * 201, "ünïcode"):
        for _ in range(2):
            with pytest.raises(InvalidArgument, match="not valid"):
                qs.check_queue_name(bad)
        assert bad not in qs._VALID_NAMES
    for i in range(qs.MAX_VALID_NAMES + 10):
        qs.check_queue_name(f"q{i}")
    assert len(qs._VALID_NAMES) <= qs.MAX_VALID_NAMES
