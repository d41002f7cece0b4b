"""``blizzard cluster --masters N``: a sharded cluster in the foreground.

A shard whose master dies is restarted on its WAL (and the console says so), while the other
shards keep serving: only the dead shard's items wait. A data node that dies stops the
cluster, as in the unsharded ``blizzard cluster`` (its shard would run short of replicas).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import click

from blizzard.cli.common import stop_on_signals
from blizzard.cli.dashboard import STATUS_PAGE_HINT

RESTART_PAUSE_S = 1.0  # between a shard master's death noticed and its restart


def run_sharded(data_dir: str, masters: int, datanodes: int, replication: int, port: int,
                node_port: int, keys: str | None, metrics: bool, log_format: str,
                start: Callable[[Any, str], None]) -> None:
    from blizzard.local.shard_cluster import ShardedCluster

    local = ShardedCluster(os.path.abspath(data_dir), masters=masters, datanodes=datanodes,
                           replication=replication, master_port=port, node_base_port=node_port,
                           keys=keys, metrics=metrics, log_format=log_format)
    stopping = stop_on_signals()
    start(local, data_dir)  # stops what it started if it fails
    try:
        spec = " ".join(local.addrs)
        click.echo(f"{masters} shards, {datanodes} data nodes each, data in {data_dir}; "
                   "Ctrl-C stops")
        for k, shard in enumerate(local.shards):
            click.echo(f"shard {k}: master {shard.masters}, data nodes "
                       f"{', '.join(n.addr for n in shard.nodes)}")
        click.echo(f"export BLIZZARD_MASTER='{spec}'")
        if keys is not None:
            click.echo(f"export BLIZZARD_KEYS={keys}")
        for k, shard in enumerate(local.shards):
            for name in shard.metrics_ports:
                click.echo(f"metrics of shard {k} {name}: {shard.metrics_url(name)}")
        click.echo(STATUS_PAGE_HINT)
        while not stopping.wait(0.2):
            _watch(local, data_dir)
    finally:
        local.stop()
        click.echo("stopped")


def _watch(local: Any, data_dir: str) -> None:
    """Restart any shard's dead master; stop everything if a data node died."""
    for k, shard in enumerate(local.shards):
        if shard.master is not None and not shard.master.alive:
            click.echo(f"shard {k}: the master {shard.master.addr} stopped "
                       f"({shard.master.popen.returncode if shard.master.popen else '?'}); "
                       "restarting it on its WAL, the other shards keep serving")
            time.sleep(RESTART_PAUSE_S)
            try:
                shard.restart_master()
            except (RuntimeError, TimeoutError) as exc:
                raise click.ClickException(f"shard {k}'s master did not come back: "
                                           f"{str(exc).splitlines()[0]} (logs in {data_dir})") \
                    from exc
            click.echo(f"shard {k}: the master serves again")
        dead = [p.name for p in shard.nodes if not p.alive]
        if dead:
            raise click.ClickException(f"shard {k}: {', '.join(dead)} exited; see logs in "
                                       f"{data_dir}/shard{k}")
