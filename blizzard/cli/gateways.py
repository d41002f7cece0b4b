"""``blizzard beanstalkd`` and ``blizzard sqs``: other queues' protocols in front of the cluster."""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

import click

from blizzard.cli.common import KEYS_ENV, keys_opt, master_opt, stop_on_signals
from blizzard.server import logs


def _check_cluster(master: str, admin: bool) -> None:
    """Refuse to start (a usage error naming why) when the cluster refuses this gateway's
    keys: every request would fail. A master not reachable yet is only warned about."""
    from blizzard.client.core import Client
    from blizzard.wire.errors import BlizzardError, SecurityError

    secure = bool(os.environ.get(KEYS_ENV))
    try:
        with Client(master, timeout_s=3.0, admin=admin and secure) as client:
            client.stats("default")
    except SecurityError as exc:
        raise click.UsageError(f"the cluster at {master} refuses this gateway: {exc} (give "
                               "the cluster's key directory with --keys)") from None
    except BlizzardError as exc:
        logging.getLogger(__name__).warning("the cluster at %s does not answer yet (%s); "
                                            "serving anyway", master, exc)


def _listen(ctx: Any, param: Any, value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise click.BadParameter(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:11300)", ctx,
                                 param)
    return host, int(port)


def _listen_or_unix(ctx: Any, param: Any, value: str) -> tuple[str, int] | str:
    """HOST:PORT, or ``unix:PATH`` (the path, as a str)."""
    if value.startswith("unix:"):
        if not value[len("unix:"):]:
            raise click.BadParameter("unix: needs a path (e.g. unix:/run/blizzard/beanstalkd.sock)",
                                     ctx, param)
        return value[len("unix:"):]
    return _listen(ctx, param, value)


def _mode(ctx: Any, param: Any, value: str) -> int:
    try:
        mode = int(value, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        raise click.BadParameter(f"{value!r} is not an octal file mode (e.g. 660)", ctx, param)
    return mode


@click.command()
@master_opt
@keys_opt
@click.option("--listen", default="127.0.0.1:11300", show_default=True,
              callback=_listen_or_unix,
              help="HOST:PORT the gateway accepts beanstalkd clients on (port 0: a free one), or "
                   "unix:PATH, a Unix socket (beanstalkd's -l unix:PATH): who may connect is "
                   "then the file's mode (--socket-mode); a live server's socket there is "
                   "refused, a stale one replaced, and the file removed on exit. Clients need "
                   "no key: anyone who reaches it may use the queues with this gateway's key.")
@click.option("--socket-mode", default="660", show_default=True, callback=_mode,
              help="With --listen unix:PATH: the socket file's mode, in octal (660: its owner "
                   "and group may connect).")
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
def beanstalkd(master: str, listen: tuple[str, int] | str, socket_mode: int,
               max_connections: int, max_job_bytes: int, admin: bool, log_level: str) -> None:
    """Speak beanstalkd's protocol to its clients (greenstalk, Pheanstalk, ...) in front of the
    cluster, until Ctrl-C.

    A tube is a queue; put is an enqueue, answered INSERTED once the master's WAL and W data
    nodes hold the job; reserve leases a job for this connection (for its tube's lease_s:
    `blizzard queue config TUBE --lease-s S`, a put's ttr is not kept); delete acks it,
    release gives it back (after DELAY), bury moves it to the dead-letter queue, touch extends
    its lease, kick redrives buried jobs (the admin key), and a closed connection gives back
    what it reserved. Every command of beanstalkd's protocol is served; kick, kick-job,
    pause-tube and deleting a job no connection reserved need --admin. SIGUSR1 enters drain
    mode, as beanstalkd's: puts are answered DRAINING until a restart. docs/beanstalkd.md
    says what differs from beanstalkd.
    """
    from blizzard.gateways.beanstalkd import BeanstalkdGateway, GatewayConfig

    where = f"unix:{listen}" if isinstance(listen, str) else f"{listen[0]}:{listen[1]}"
    logs.setup(log_level, "text", "beanstalkd", where)
    _check_cluster(master, admin)
    host, port = ("127.0.0.1", 0) if isinstance(listen, str) else listen
    try:
        gateway = BeanstalkdGateway(GatewayConfig(
            master, host, port, max_connections=max_connections, max_job_bytes=max_job_bytes,
            admin=admin, listen_path=listen if isinstance(listen, str) else "",
            socket_mode=socket_mode))
    except (OSError, ValueError) as exc:
        raise click.UsageError(f"cannot listen on {where}: {exc}") from None
    click.echo(f"beanstalkd gateway on {gateway.address} for {master}", err=True)
    signal.signal(signal.SIGUSR1, lambda *_: gateway.drain())  # as beanstalkd: drain mode
    stop = stop_on_signals()
    def stop_when_told() -> None:
        stop.wait()
        gateway.stop()

    threading.Thread(target=stop_when_told, daemon=True).start()
    gateway.serve_forever()


@click.command()
@master_opt
@keys_opt
@click.option("--listen", default="127.0.0.1:9324", show_default=True, callback=_listen,
              help="HOST:PORT the gateway serves SQS's API on (port 0: a free one).")
@click.option("--credentials", type=click.Path(exists=True, dir_okay=False), default=None,
              help="File of access keys, one a line: ACCESS_KEY_ID SECRET_ACCESS_KEY ROLE "
                   "(client or admin), readable by its owner only. Requests must be signed "
                   "(AWS Signature Version 4) with one of them. Without it the gateway takes "
                   "unsigned requests from anyone, and says so.")
@click.option("--admin", is_flag=True,
              help="Hold the admin key of --keys too, for callers of the admin role: "
                   "SetQueueAttributes, DeleteQueue, PurgeQueue, tags, a RedrivePolicy and "
                   "StartMessageMoveTask need it.")
@click.option("--region", default="us-east-1", show_default=True,
              help="The region named in queue ARNs.")
@click.option("--max-connections", default=256, show_default=True,
              type=click.IntRange(1, 100_000),
              help="Connections served at once (each a thread); more are closed unanswered.")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="NAME",
              help="A host name clients reach the gateway by (besides its address, localhost "
                   "and IP addresses); requests for other names are refused. Repeatable.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
def sqs(master: str, listen: tuple[str, int], credentials: str | None, admin: bool,
        region: str, max_connections: int, allow_hosts: tuple[str, ...],
        log_level: str) -> None:
    """Serve Amazon SQS's API (boto3 and every AWS SDK, with endpoint_url set to this
    gateway) in front of the cluster, until Ctrl-C.

    Both of SQS's wire forms are taken on one port: the JSON protocol current SDKs send and
    the older query protocol (XML replies). A queue is the Blizzard queue of the same name;
    SendMessage is answered once the master's WAL and W data nodes hold the message;
    ReceiveMessage leases for the visibility timeout; DeleteMessage acks. A FIFO queue's
    MessageGroupId is the item's key: one message of a group in flight at a time, in order.
    docs/sqs.md has the whole mapping and what differs from SQS.
    """
    from blizzard.gateways.sqs import SqsConfig, SqsServer

    logs.setup(log_level, "text", "sqs", f"{listen[0]}:{listen[1]}")
    _check_cluster(master, admin)
    try:
        server = SqsServer(SqsConfig(master, listen[0], listen[1], credentials=credentials,
                                     admin=admin, region=region,
                                     max_connections=max_connections,
                                     allow_hosts=allow_hosts))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if credentials is None:
        logging.getLogger(__name__).warning(
            "no --credentials: this gateway takes unsigned requests from anyone who reaches %s:%d",
            listen[0], server.server_port)
    click.echo(f"SQS gateway on http://{listen[0]}:{server.server_port} for {master}"
               f"{'' if credentials else ' (no --credentials: anyone may use it)'}", err=True)
    stop = stop_on_signals()

    def stop_when_told() -> None:
        stop.wait()
        server.shutdown()

    threading.Thread(target=stop_when_told, daemon=True).start()
    server.serve_forever()
    server.server_close()
