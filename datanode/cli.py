"""A data node's command: ``python -m datanode`` runs it, ``blizzard datanode`` is the same command.

Option defaults are ``DatanodeConfig``'s, so each is written once.
"""

from __future__ import annotations

import click

from blizzard.cli_common import (ADDRESS, config_defaults, log_level, master_opt, security,
                                 serve, server_command, setup_logging)
from datanode.config import DatanodeConfig

_DEFAULT = config_defaults(DatanodeConfig)


@server_command("datanode", "Directory for this node's LevelDB and id (created if missing).",
                _DEFAULT["bind"])
@click.option("--advertise", type=ADDRESS, default=None,
              help="Address clients and peers use to reach this node; default: --bind.")
@master_opt
@click.option("--heartbeat-s", default=_DEFAULT["heartbeat_s"], show_default=True,
              type=click.FloatRange(0.01), help="Seconds between heartbeats to the master.")
@click.option("--max-item-bytes", default=_DEFAULT["max_item_bytes"], show_default=True,
              type=click.IntRange(1), help="Largest blob accepted.")
@log_level
def datanode_command(data_dir: str, bind: str, advertise: str | None, master: str,
                     heartbeat_s: float, max_item_bytes: int, keys: str | None, insecure: bool,
                     metrics_port: int | None, metrics_addr: str, log_level: str) -> None:
    """Run a data node: stores payload blobs in LevelDB.

    Security: give the key directory (--keys, made by `blizzard keys generate`) or --insecure.
    """
    from blizzard.errors import AuthenticationFailed
    from blizzard.metrics import MetricsUnavailable
    from datanode.server import DatanodeServer

    setup_logging(log_level)
    config = DatanodeConfig(data_dir=data_dir, bind=bind, master=master, advertise=advertise,
                            heartbeat_s=heartbeat_s, max_item_bytes=max_item_bytes,
                            keys=security(keys, insecure), metrics_port=metrics_port,
                            metrics_addr=metrics_addr)
    try:
        server = DatanodeServer(config)
    except (AuthenticationFailed, MetricsUnavailable) as exc:
        raise click.ClickException(str(exc)) from None
    serve(server)
