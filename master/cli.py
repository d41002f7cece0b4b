"""The master's command: ``python -m master`` runs it, ``blizzard master`` is the same command.

Option defaults are ``MasterConfig``'s, so each is written once.
"""

from __future__ import annotations

import click

from blizzard import logs
from blizzard.cli_common import config_defaults, security, serve, server_command, start
from master.config import MasterConfig

_DEFAULT = config_defaults(MasterConfig)


@server_command("master", "Directory for the master's WAL (created if missing).", _DEFAULT["bind"])
@click.option("--replication", default=_DEFAULT["replication"], show_default=True,
              type=click.IntRange(1, 9), help="Copies of each item (R).")
@click.option("--min-replicas", default=None, type=click.IntRange(1, 9),
              help="Copies that must be durable before an enqueue is acknowledged (W); default R.")
@click.option("--heartbeat-s", default=_DEFAULT["heartbeat_s"], show_default=True,
              type=click.FloatRange(0.01), help="How often data nodes should heartbeat.")
@click.option("--dead-after-s", default=_DEFAULT["dead_after_s"], show_default=True,
              type=click.FloatRange(0.05), help="A data node silent this long is dead.")
@click.option("--pending-timeout-s", default=_DEFAULT["pending_timeout_s"], show_default=True,
              type=click.FloatRange(0.1),
              help="Ids handed out and not enqueued, or items staged and not committed, "
                   "within this are dropped and their blobs deleted.")
@click.option("--max-item-bytes", default=_DEFAULT["max_item_bytes"], show_default=True,
              type=click.IntRange(1), help="Largest payload accepted.")
@click.option("--checkpoint-records", default=_DEFAULT["checkpoint_records"], show_default=True,
              type=click.IntRange(1), help="Write a checkpoint (in a forked child) after "
              "this many WAL records; restarts replay at most about this many.")
@click.option("--rebuild-from-datanodes", "rebuild_from", default="", metavar="ADDR,ADDR,...",
              help="The master's data dir was lost: on an EMPTY --data-dir, first rebuild every "
              "queued item from the metadata these data nodes keep (list them all: "
              "tcp://HOST:PORT,...), adopting their cluster id, then serve. Refused if the data "
              "dir holds a WAL. Needs the admin key pair in --keys. Items acked shortly before "
              "the loss may come back; queue settings start from the defaults.")
def master_command(data_dir: str, bind: str, replication: int, min_replicas: int | None,
                   heartbeat_s: float, dead_after_s: float, pending_timeout_s: float,
                   max_item_bytes: int, checkpoint_records: int, rebuild_from: str,
                   keys: str | None, insecure: bool, metrics_port: int | None,
                   metrics_addr: str, log_level: str, log_format: str) -> None:
    """Run the master: queue metadata, ids, placement, leases, WAL.

    Security: give the key directory (--keys, made by `blizzard keys generate`) or --insecure.
    Options also come from BLIZZARD_MASTER_<OPTION> variables and from a TOML file (--config).
    """
    from master.server import MasterServer
    from master.wal import WalCorrupt, WalLocked

    logs.setup(log_level, log_format, "master", bind)
    config = MasterConfig(data_dir=data_dir, bind=bind, replication=replication,
                          min_replicas=min_replicas, heartbeat_s=heartbeat_s,
                          dead_after_s=dead_after_s, pending_timeout_s=pending_timeout_s,
                          max_item_bytes=max_item_bytes, checkpoint_records=checkpoint_records,
                          keys=security(keys, insecure), metrics_port=metrics_port,
                          metrics_addr=metrics_addr)
    def make() -> MasterServer:
        if not rebuild_from:
            return MasterServer(config)
        from master.rebuild import hold_reads, parse_addrs, rebuild
        rebuild(config, parse_addrs(rebuild_from))  # before the master binds
        return hold_reads(MasterServer(config))

    serve(start(make, "master", bind, (WalCorrupt, WalLocked)), "master")
