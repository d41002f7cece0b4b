"""``scripts/fuzz``: start a local cluster, run a fuzz campaign (``chaos/fuzz/campaign.py``),
print one JSON line per run and check, exit 1 on any exit, stall, loss or change."""

from __future__ import annotations

import json
import sys
import tempfile
import time

import click

from blizzard.local.harness import LocalCluster, free_port
from chaos.fuzz.campaign import Plan, run
from chaos.fuzz.floods import FloodPlan, flood_campaign
from chaos.fuzz.http_floods import HttpFloodPlan, http_flood_campaign


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
@click.option("--http-hold", default=1000, show_default=True, type=click.IntRange(0),
              help="Half-open HTTP requests held to each metrics port and the dashboard; "
                   "then a foreign Host, a scrape flood and heads subscription floods "
                   "(chaos/fuzz/http_floods.py); 0: none of these.")
@click.option("--http-queues", default=2000, show_default=True, type=click.IntRange(0),
              help="Queues on the master while its /metrics is flooded with scrapes.")
@click.option("--subscriptions", default=20_000, show_default=True, type=click.IntRange(0),
              help="Distinct heads subscriptions one connection sends.")
def main(frames: int, raw: int, hold: int, seed: int, items: int, nofile: int,
         flood_hold: int, flood_s: float, http_hold: int, http_queues: int,
         subscriptions: int) -> None:
    """Fuzz a fresh secure 1-master, 2-data-node cluster (R=2) on loopback."""
    started = time.monotonic()
    heads_port = free_port()
    with tempfile.TemporaryDirectory(prefix="blizzard-fuzz-") as base, \
            LocalCluster(base, datanodes=2, replication=2, heartbeat_s=0.2,
                         dead_after_s=1.5, nofile=nofile, metrics=True,
                         master_args=["--heads-bind", f"tcp://127.0.0.1:{heads_port}"]
                         ) as cluster:
        def emit(line: dict) -> None:
            print(json.dumps(line), flush=True)

        problems = run(cluster, Plan(frames=frames, raw=raw, hold=hold, items=items, seed=seed),
                       emit)
        if flood_hold:  # chaos/fuzz/floods.py
            problems += flood_campaign(cluster, FloodPlan(hold=flood_hold, seconds=flood_s), emit)
        if http_hold:  # chaos/fuzz/http_floods.py
            problems += http_flood_campaign(cluster, heads_port, HttpFloodPlan(
                hold=http_hold, queues=http_queues, subscriptions=subscriptions), emit)
        emit({"verdict": "fail" if problems else "ok", "problems": problems,
              "seconds": round(time.monotonic() - started, 1)})
        if problems:
            print(cluster.logs(), file=sys.stderr)
    if problems:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
