"""A data node's command: ``python -m datanode`` runs it, ``blizzard datanode`` is the same command.

Option defaults are ``DatanodeConfig``'s, so each is written once.
"""

from __future__ import annotations

import click

from blizzard.cli.common import (
    ADDRESS,
    Seconds,
    config_defaults,
    master_opt,
    needs_server_extra,
    security,
    serve,
    server_command,
    start,
)
from blizzard.server import logs
from blizzard.wire.codec import MAX_ITEM_BYTES
from datanode.config import DatanodeConfig

_DEFAULT = config_defaults(DatanodeConfig)


@server_command("datanode", "Directory for this node's LevelDB and id (created if missing).",
                _DEFAULT["bind"])
@click.option("--advertise", type=ADDRESS, default=None,
              help="Address clients and peers use to reach this node; default: --bind.")
@master_opt
@click.option("--heartbeat-s", default=_DEFAULT["heartbeat_s"], show_default=True,
              type=Seconds(0.01), help="Seconds between heartbeats to the master.")
@click.option("--max-item-bytes", default=_DEFAULT["max_item_bytes"], show_default=True,
              type=click.IntRange(1, MAX_ITEM_BYTES), help="Largest blob accepted.")
@click.option("--sync-hold-ms", default=_DEFAULT["sync_hold_ms"], show_default=True,
              type=click.FloatRange(0, 100),
              help="While other producers were busy in the last 20 ms, hold a pass's synced "
                   "write open this long for the requests on their way, so one synced write "
                   "serves them too (group commit across callers); 0: never hold. Adds at most "
                   "this much latency, and only under load.")
@click.option("--join-cluster", default="", metavar="ID",
              help="Attach a node that holds blobs but no cluster id (from before cluster ids) "
                   "to cluster ID; its master refuses it otherwise. Blobs no item of that "
                   "cluster names are deleted.")
@click.option("--copy-confirm-s", default=_DEFAULT["copy_confirm_s"], show_default=True,
              type=Seconds(0.1, 3600), help="A copy another data node sent is reported to the "
              "master this long after it is stored; the master deletes copies it did not order.")
@click.option("--node-key", default=None, metavar="NAME",
              help="This node's own key in --keys (`blizzard keys add-node DIR NAME`); "
                   "default: the only data node key there.")
def datanode_command(data_dir: str, bind: str, advertise: str | None, master: str,
                     heartbeat_s: float, max_item_bytes: int, sync_hold_ms: float,
                     join_cluster: str,
                     copy_confirm_s: float, node_key: str | None,
                     keys: str | None, insecure: bool,
                     metrics_port: int | None, metrics_addr: str,
                     metrics_allow_hosts: tuple[str, ...], log_level: str,
                     log_format: str) -> None:
    """Run a data node: stores payload blobs in LevelDB.

    Security: give the key directory (--keys, made by `blizzard keys generate`) or --insecure;
    the node speaks with its own key in it (`blizzard keys add-node DIR NAME`, --node-key).
    Options also come from BLIZZARD_DATANODE_<OPTION> variables (the master address from
    BLIZZARD_MASTER) and from a TOML file (--config).
    """
    needs_server_extra("data node")
    from datanode.server import DatanodeServer

    fields = logs.setup(log_level, log_format, "datanode", advertise or bind)
    config = DatanodeConfig(data_dir=data_dir, bind=bind, master=master, advertise=advertise,
                            heartbeat_s=heartbeat_s, max_item_bytes=max_item_bytes,
                            keys=security(keys, insecure), metrics_port=metrics_port,
                            metrics_addr=metrics_addr, metrics_allow_hosts=metrics_allow_hosts,
                            join_cluster=join_cluster, copy_confirm_s=copy_confirm_s,
                            node_key=node_key, sync_hold_ms=sync_hold_ms)
    server = start(lambda: DatanodeServer(config), "data node", bind)
    fields.node_id = server.node_id
    serve(server, "data node")
