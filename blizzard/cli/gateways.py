"""``blizzard beanstalkd``: serve beanstalkd's protocol in front of the cluster."""

from __future__ import annotations

import threading
from typing import Any

import click

from blizzard.cli.common import keys_opt, master_opt, stop_on_signals
from blizzard.server import logs


def _listen(ctx: Any, param: Any, value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise click.BadParameter(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:11300)", ctx,
                                 param)
    return host, int(port)


@click.command()
@master_opt
@keys_opt
@click.option("--listen", default="127.0.0.1:11300", show_default=True, callback=_listen,
              help="HOST:PORT the gateway accepts beanstalkd clients on (port 0: a free one). "
                   "Clients need no key: on an address others reach, anyone there may use the "
                   "queues with this gateway's key.")
@click.option("--max-connections", default=1024, show_default=True,
              type=click.IntRange(1, 100_000),
              help="Connections served at once; more are closed as they come.")
@click.option("--max-job-bytes", default=65_535, show_default=True,
              type=click.IntRange(0, 16 * 1024 * 1024),
              help="Largest job body a put may carry (beanstalkd's -z); larger: JOB_TOO_BIG.")
@click.option("--admin", is_flag=True,
              help="Speak to the cluster with the admin key of --keys: kick (a redrive) and "
                   "deleting a job no connection reserved need it. Every client of the "
                   "gateway then has those powers.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
def beanstalkd(master: str, listen: tuple[str, int], max_connections: int, max_job_bytes: int,
               admin: bool, log_level: str) -> None:
    """Speak beanstalkd's protocol to its clients (greenstalk, Pheanstalk, ...) in front of the
    cluster, until Ctrl-C.

    A tube is a queue; put is an enqueue, answered INSERTED once the master's WAL and W data
    nodes hold the job; reserve leases a job for this connection (for its tube's lease_s:
    `blizzard queue config TUBE --lease-s S`, a put's ttr is not kept); delete acks it,
    release gives it back (after DELAY), bury moves it to the dead-letter queue, touch extends
    its lease, kick redrives buried jobs (the admin key), and a closed connection gives back
    what it reserved. Served so far: put, use, reserve, reserve-with-timeout, delete, release,
    bury, touch, watch, ignore, kick, peek-ready, peek-buried, stats-job, stats-tube, stats,
    list-tubes, list-tube-used, list-tubes-watched, quit; the others answer UNKNOWN_COMMAND.
    """
    from blizzard.gateways.beanstalkd import BeanstalkdGateway, GatewayConfig

    logs.setup(log_level, "text", "beanstalkd", f"{listen[0]}:{listen[1]}")
    gateway = BeanstalkdGateway(GatewayConfig(master, listen[0], listen[1],
                                              max_connections=max_connections,
                                              max_job_bytes=max_job_bytes, admin=admin))
    click.echo(f"beanstalkd gateway on {listen[0]}:{gateway.port} for {master}", err=True)
    stop = stop_on_signals()
    def stop_when_told() -> None:
        stop.wait()
        gateway.stop()

    threading.Thread(target=stop_when_told, daemon=True).start()
    gateway.serve_forever()
