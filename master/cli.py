"""The master's command: ``python -m master`` runs it, ``blizzard master`` is the same command.

Option defaults are ``MasterConfig``'s, so each is written once.
"""

from __future__ import annotations

from typing import Any

import click
import zmq

from blizzard.cli.common import (
    ADDRESS,
    Seconds,
    config_defaults,
    keys_opt,
    master_opt,
    needs_server_extra,
    security,
    serve,
    server_command,
    start,
    timeout_opt,
)
from blizzard.server import logs
from blizzard.wire.codec import MAX_ITEM_BYTES
from blizzard.wire.errors import BlizzardError
from master.config import MasterConfig

_DEFAULT = config_defaults(MasterConfig)


class MasterCommand(click.Command):
    """``blizzard master ...`` runs a master; ``blizzard master promote ...`` promotes a standby."""

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        if args[:1] == ["promote"]:
            return promote_command.make_context(f"{info_name} promote", args[1:], parent, **extra)
        return super().make_context(info_name, args, parent, **extra)


@server_command("master", "Directory for the master's WAL (created if missing).", _DEFAULT["bind"],
                cls=MasterCommand)
@click.option("--replication", default=_DEFAULT["replication"], show_default=True,
              type=click.IntRange(1, 9), help="Copies of each item (R).")
@click.option("--min-replicas", default=None, type=click.IntRange(1, 9),
              help="Copies that must be durable before an enqueue is acknowledged (W); default R.")
@click.option("--heartbeat-s", default=_DEFAULT["heartbeat_s"], show_default=True,
              type=Seconds(0.01), help="How often data nodes should heartbeat.")
@click.option("--dead-after-s", default=_DEFAULT["dead_after_s"], show_default=True,
              type=Seconds(0.05), help="A data node silent this long is dead.")
@click.option("--suspect-after-s", default=None, type=Seconds(0.01),
              help="A data node silent this long is suspect: placed only if too few others "
                   "are healthy, read from last, named to clients so they skip it (a node "
                   "slow to store a write is hedged around, not suspected). Between "
                   "--heartbeat-s and --dead-after-s; default the shorter of 2.5 heartbeats "
                   "and half of --dead-after-s.")
@click.option("--pending-timeout-s", default=_DEFAULT["pending_timeout_s"], show_default=True,
              type=Seconds(0.1),
              help="Ids handed out and not enqueued, or items staged and not committed, "
                   "within this are dropped and their blobs deleted.")
@click.option("--sync-hold-ms", default=_DEFAULT["sync_hold_ms"], show_default=True,
              type=click.FloatRange(0, 100),
              help="While other clients were busy in the last 20 ms, hold a pass's WAL fsync "
                   "open this long for the requests on their way, so one WAL fsync serves them "
                   "too (group commit across callers); 0: never hold. Adds at most this much "
                   "latency, and only under load.")
@click.option("--max-item-bytes", default=_DEFAULT["max_item_bytes"], show_default=True,
              type=click.IntRange(1, MAX_ITEM_BYTES), help="Largest payload accepted.")
@click.option("--checkpoint-records", default=_DEFAULT["checkpoint_records"], show_default=True,
              type=click.IntRange(1), help="Write a checkpoint (in a forked child) after "
              "this many WAL records; restarts replay at most about this many.")
@click.option("--keep-wal", is_flag=True,
              help="Keep every WAL segment, also those a checkpoint covers (the whole history, "
                   "for an audit or a chaos run's checks); the disk use grows without bound.")
@click.option("--standby-of", type=ADDRESS, default=None,
              help="Run as a hot standby of the primary master at this address: follow its "
                   "WAL, answer clients with the primary's address, take over when promoted.")
@click.option("--advertise", type=ADDRESS, default=None,
              help="The address others reach this master at (default: --bind).")
@click.option("--sync-standby/--no-sync-standby", default=_DEFAULT["sync_standby"],
              show_default=True,
              help="Once a standby has caught up, confirm a request only when the standby "
                   "holds it durably too, so a failover loses nothing acknowledged (while "
                   "the standby is down, nothing is confirmed).")
@click.option("--failover-after-s", default=_DEFAULT["failover_after_s"], show_default=True,
              type=Seconds(0), help="A standby in sync promotes itself after its "
              "primary was silent this long (0: only `blizzard master promote`).")
@click.option("--rebuild-from-datanodes", "rebuild_from", default="", metavar="ADDR,ADDR,...",
              help="The master's data dir was lost: on an EMPTY --data-dir, first rebuild every "
              "queued item from the metadata these data nodes keep (list them all: "
              "tcp://HOST:PORT,...), adopting their cluster id, then serve. Refused if the data "
              "dir holds a WAL. Needs the admin key pair in --keys. Items acked shortly before "
              "the loss may come back; queue settings start from the defaults.")
@click.option("--shard", default=_DEFAULT["shard"], show_default=True, type=click.IntRange(0, 127),
              help="This master's shard in a sharded queue (its item ids start at SHARD << 56, "
                   "so an id names its shard). Keep it across restarts; a data dir of another "
                   "shard is refused.")
@click.option("--shards", default=_DEFAULT["shards"], metavar="'ADDR ADDR ...'",
              help="Every shard's master address in shard order, space-separated (a shard with "
                   "a standby: ADDR,ADDR), told to clients so one address finds them all.")
@click.option("--heads-bind", type=ADDRESS, default=None,
              help="Publish each queue's head (ready count, first item's priority) on a ZeroMQ "
                   "XPUB socket here whenever it changes, for the queues someone subscribes to: "
                   "sharded clients pick the best shard from them without asking (default: off).")
@click.option("--max-queues", default=_DEFAULT["max_queues"], show_default=True,
              type=click.IntRange(1), help="Queues the master holds at most (admin keys may "
              "create up to this many; every queue costs memory and WAL).")
@click.option("--client-queues", default=_DEFAULT["client_queues"], show_default=True,
              type=click.IntRange(1), help="A client key creates a queue (or enqueues to a new "
              "one) only while fewer than this many exist; the rest up to --max-queues is the "
              "admins' headroom. All client keys share it. Refused: TooManyQueues.")
@click.option("--client-settings", default=_DEFAULT["client_settings"], show_default=True,
              metavar="'SETTING ...'", help="The queue settings a client key may set when it "
              "creates a queue (space-separated; 'all'; '' for none). Any other setting that "
              "differs from its default needs an admin key (Forbidden).")
@click.option("--metrics-queues", default=_DEFAULT["metrics_queues"], show_default=True,
              type=click.IntRange(1), help="Queues /metrics names (the first by name); the "
              "rest are summed in one series, queue=\"(other)\", so a scrape stays small "
              "however many queues there are.")
def master_command(data_dir: str, bind: str, replication: int, min_replicas: int | None,
                   heartbeat_s: float, dead_after_s: float, suspect_after_s: float | None,
                   pending_timeout_s: float, sync_hold_ms: float, max_item_bytes: int,
                   checkpoint_records: int, keep_wal: bool, keys: str | None,
                   insecure: bool, metrics_port: int | None, metrics_addr: str,
                   metrics_allow_hosts: tuple[str, ...], metrics_queues: int,
                   log_level: str, log_format: str, standby_of: str | None,
                   advertise: str | None, sync_standby: bool, failover_after_s: float,
                   rebuild_from: str, shard: int, shards: str, heads_bind: str | None,
                   max_queues: int, client_queues: int, client_settings: str) -> None:
    """Run the master: queue metadata, ids, placement, leases, WAL.

    Security: give the key directory (--keys, made by `blizzard keys generate`) or --insecure.
    Options also come from BLIZZARD_MASTER_<OPTION> variables and from a TOML file (--config).
    With --standby-of it runs as a hot standby; `blizzard master promote --master ADDR`
    makes a standby the primary.
    """
    needs_server_extra("master")
    from master.ha.standby import StandbyServer
    from master.log.wal import WalCorrupt, WalLocked
    from master.server import MasterServer

    logs.setup(log_level, log_format, "master", bind)
    config = MasterConfig(data_dir=data_dir, bind=bind, replication=replication,
                          min_replicas=min_replicas, heartbeat_s=heartbeat_s,
                          dead_after_s=dead_after_s, suspect_after_s=suspect_after_s,
                          pending_timeout_s=pending_timeout_s, sync_hold_ms=sync_hold_ms,
                          max_item_bytes=max_item_bytes, checkpoint_records=checkpoint_records,
                          keep_wal=keep_wal,
                          keys=security(keys, insecure), metrics_port=metrics_port,
                          metrics_addr=metrics_addr, metrics_allow_hosts=metrics_allow_hosts,
                          metrics_queues=metrics_queues, standby_of=standby_of,
                          advertise=advertise, sync_standby=sync_standby,
                          failover_after_s=failover_after_s, shard=shard,
                          shards=" ".join(shards.split()), heads_bind=heads_bind,
                          max_queues=max_queues, client_queues=client_queues,
                          client_settings=client_settings)
    if rebuild_from and standby_of:
        raise click.UsageError("--rebuild-from-datanodes makes a primary; drop --standby-of")

    def make() -> Any:
        if standby_of:
            return StandbyServer(config)
        if not rebuild_from:
            return MasterServer(config)
        from master.ha.rebuild import hold_reads, parse_addrs, rebuild
        rebuild(config, parse_addrs(rebuild_from))  # before the master binds
        return hold_reads(MasterServer(config))

    serve(start(make, "master", bind, (WalCorrupt, WalLocked)), "master")


@click.command("promote")
@master_opt
@keys_opt
@timeout_opt
@click.option("--force", is_flag=True, help="Promote a standby that is not in sync with its "
              "primary (it may lack writes the primary acknowledged).")
def promote_command(master: str, timeout_s: float, force: bool) -> None:
    """Make the standby at --master the primary (admin key): it raises the epoch, and the old
    primary, if it still runs, stops confirming anything and exits once it learns of it."""
    from blizzard.net.keys import resolve
    from blizzard.net.transport import Endpoint, call
    from blizzard.wire import protocol as p

    keys = resolve(None, "admin")
    endpoint = Endpoint(zmq.Context.instance(), master, keys, keys.master if keys else None)
    try:
        reply = call(endpoint, p.Promote(force), timeout_s)
    except TimeoutError:
        raise click.ClickException(f"{master} did not answer within {timeout_s:g}s") from None
    except BlizzardError as exc:
        raise click.ClickException(f"{exc.message} ({type(exc).__name__})") from None
    finally:
        endpoint.close()
    click.echo(f"{master} is the primary now, epoch {reply.epoch}")
