"""``--watch [SECONDS]``: a command's output shown again every few seconds until Ctrl-C.

On a terminal each refresh redraws the screen in place (cursor home, clear); into a pipe or
file the snapshots follow one another, each under a header line, so a log of them reads in
order. With ``--json`` every refresh is one JSON document on one line (JSON Lines).

SIGINT (Ctrl-C) and SIGTERM end a watch, exit status 0, by handlers of its own: a process
started with SIGINT ignored (``&`` in a script, some CI runners) never gets the
``KeyboardInterrupt`` Python's default handler raises.
"""

from __future__ import annotations

import json
import math
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from blizzard.wire.errors import BlizzardError

DEFAULT_EVERY_S = 2.0
MIN_EVERY_S = 0.1
HOME_AND_CLEAR = "\x1b[H\x1b[2J"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interval(click.FloatRange):
    """Seconds between refreshes: a finite number, at least ``MIN_EVERY_S`` (nan passes a
    range check, and would refresh without pause; inf would never refresh)."""

    def __init__(self) -> None:
        super().__init__(MIN_EVERY_S)

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        every_s = super().convert(value, param, ctx)
        if not math.isfinite(every_s):
            self.fail(f"{value!r} is not a number of seconds (finite, at least "
                      f"{MIN_EVERY_S:g})", param, ctx)
        return every_s


watch_opt = click.option(
    "--watch", "watch_s", type=Interval(), is_flag=False, flag_value=DEFAULT_EVERY_S,
    default=None, metavar="[SECONDS]",
    help=f"Show it again every SECONDS (at least {MIN_EVERY_S:g}; {DEFAULT_EVERY_S:g} if not "
         "given) until Ctrl-C or SIGTERM (exit 0): in place on a terminal; with --json one "
         "document per line.")


class _Stopped(BaseException):
    """Raised by SIGINT or SIGTERM wherever the watch is, a refresh waiting on a master that
    does not answer included (a BaseException: no ``except Exception`` on the way stops it)."""


def _stop(signum: int, frame: Any) -> None:
    raise _Stopped


def watch(render: Callable[[], str], every_s: float, *, as_json: bool) -> None:
    """Print ``render()`` every ``every_s`` seconds until SIGINT (Ctrl-C) or SIGTERM, which
    end it quietly; the signals' handlers are put back after.

    An error from the cluster (say, the master restarting) is shown in place of the output
    (with --json: ``{"error", "error_class"}``) and the next refresh tries again: a watch
    outlives what it watches.
    """
    in_place = sys.stdout.isatty() and not as_json
    previous: dict[int, Any] = {}
    try:
        for signum in STOP_SIGNALS:  # also when ignored (started by `&`): it must stop
            previous[signum] = signal.signal(signum, _stop)
        while True:
            started = time.monotonic()
            try:
                text = render()
            except BlizzardError as exc:
                text = json.dumps({"error": exc.message, "error_class": type(exc).__name__}) \
                    if as_json else f"error: {exc.message} ({type(exc).__name__}); trying again"
            if not as_json:
                header = (f"{time.strftime('%H:%M:%S')}, every {every_s:g} s; Ctrl-C stops")
                text = f"{HOME_AND_CLEAR if in_place else ''}{header}\n{text}"
                text += "" if in_place else "\n"  # a blank line between snapshots
            click.echo(text)
            time.sleep(max(0.0, every_s - (time.monotonic() - started)))
    except _Stopped:
        if in_place:
            click.echo()
    finally:
        for number, handler in previous.items():  # None: a handler not set from Python
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
