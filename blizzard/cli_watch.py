"""``--watch [SECONDS]``: a command's output shown again every few seconds until Ctrl-C.

On a terminal each refresh redraws the screen in place (cursor home, clear); into a pipe or
file the snapshots follow one another, each under a header line, so a log of them reads in
order. With ``--json`` every refresh is one JSON document on one line (JSON Lines).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Callable

import click

from blizzard.errors import BlizzardError

DEFAULT_EVERY_S = 2.0
HOME_AND_CLEAR = "\x1b[H\x1b[2J"

watch_opt = click.option(
    "--watch", "watch_s", type=click.FloatRange(0.1), is_flag=False, flag_value=DEFAULT_EVERY_S,
    default=None, metavar="[SECONDS]",
    help=f"Show it again every SECONDS ({DEFAULT_EVERY_S:g} if not given) until Ctrl-C: in "
         "place on a terminal; with --json one document per line.")


def watch(render: Callable[[], str], every_s: float, *, as_json: bool) -> None:
    """Print ``render()`` every ``every_s`` seconds until Ctrl-C, which ends it quietly.

    An error from the cluster (say, the master restarting) is shown in place of the output
    (with --json: ``{"error", "error_class"}``) and the next refresh tries again: a watch
    outlives what it watches.
    """
    in_place = sys.stdout.isatty() and not as_json
    try:
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
    except KeyboardInterrupt:
        if in_place:
            click.echo()
