"""``scripts/fuzz``: start a local cluster, run a fuzz campaign (``chaos/fuzz_campaign.py``),
print one JSON line per run and check, exit 1 on any exit, stall, loss or change."""

from __future__ import annotations

import json
import sys
import tempfile
import time

import click

from blizzard.harness import LocalCluster
from chaos.fuzz_campaign import Plan, run
from chaos.fuzz_floods import FloodPlan, flood_campaign


@click.command()
@click.option("--frames", default=10_000, show_default=True,
              help="Hostile messages per server and way in (each admitted key, each refused "
                   "socket).")
@click.option("--raw", default=10_000, show_default=True,
              help="Raw TCP connections with hostile bytes per server.")
@click.option("--hold", default=200, show_default=True,
              help="Raw connections left open, unread, at a time.")
@click.option("--seed", default=0, show_default=True, help="First random seed (one per run).")
@click.option("--items", default=200, show_default=True,
              help="Items enqueued before fuzzing, all checked afterwards.")
@click.option("--nofile", default=1024, show_default=True, type=click.IntRange(256),
              help="The servers' file descriptor limit (soft and hard), as on a host with "
                   "systemd's default.")
@click.option("--flood-hold", default=1500, show_default=True, type=click.IntRange(0),
              help="Connection flood: idle TCP connections held open to each server at once "
                   "(those shut replaced) while round trips go on; 0: no flood.")
@click.option("--flood-s", default=8.0, show_default=True, type=click.FloatRange(0.5, 600),
              help="How long the connection flood lasts.")
def main(frames: int, raw: int, hold: int, seed: int, items: int, nofile: int,
         flood_hold: int, flood_s: float) -> None:
    """Fuzz a fresh secure 1-master, 2-data-node cluster (R=2) on loopback."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="blizzard-fuzz-") as base, \
            LocalCluster(base, datanodes=2, replication=2, heartbeat_s=0.2,
                         dead_after_s=1.5, nofile=nofile) as cluster:
        def emit(line: dict) -> None:
            print(json.dumps(line), flush=True)

        problems = run(cluster, Plan(frames=frames, raw=raw, hold=hold, items=items, seed=seed),
                       emit)
        if flood_hold:  # chaos/fuzz_floods.py
            problems += flood_campaign(cluster, FloodPlan(hold=flood_hold, seconds=flood_s), emit)
        emit({"verdict": "fail" if problems else "ok", "problems": problems,
              "seconds": round(time.monotonic() - started, 1)})
        if problems:
            print(cluster.logs(), file=sys.stderr)
    if problems:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
