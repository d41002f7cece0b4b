"""``blizzard dashboard``: a live, read-only status page of a running cluster."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import click

from blizzard.cli.common import Seconds, keys_opt, master_opt
from blizzard.dashboard.sampler import MAX_SAMPLES
from blizzard.net.defaults import LOOPBACK

DASHBOARD_PORT = 8080
STATUS_PAGE_HINT = ("status page: run `blizzard dashboard` in another shell with the exports "
                    f"above, then open http://{LOOPBACK}:{DASHBOARD_PORT}/ (or: blizzard status)")


@click.command("dashboard")
@master_opt
@keys_opt
@click.option("--port", default=DASHBOARD_PORT, show_default=True,
              type=click.IntRange(0, 65535), help="HTTP port of the page (0: a free one).")
@click.option("--bind", default=LOOPBACK, show_default=True,
              help="Address the page listens on. The page has no login and shows queue names "
                   "and counts: on loopback only this machine sees it.")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="NAME",
              help="Also answer requests for Host NAME (repeatable): the name people use to "
                   "reach the page, e.g. this machine's name with --bind 0.0.0.0. The page "
                   "answers only to its bind address, localhost and 127.0.0.1 otherwise, so "
                   "that no other site can read it through a browser (DNS rebinding).")
@click.option("--interval-s", default=2.0, show_default=True, type=Seconds(0.2, 60),
              help="Seconds between two samples of the master (and page refreshes).")
@click.option("--history-s", default=600.0, show_default=True,
              type=Seconds(10, 86_400),
              help=f"How far back the charts reach; at most {MAX_SAMPLES} times --interval-s "
                   "(e.g. 86400 needs --interval-s 24).")
@click.option("--timeout-s", default=3.0, show_default=True, type=Seconds(0.1, 60),
              help="Count a sample as failed when the master takes longer than this.")
@click.option("--log-level", default="warning", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]),
              help="Logging verbosity on stderr (warning: when the master stops or starts "
                   "answering).")
def dashboard(master: str, port: int, bind: str, allow_hosts: tuple[str, ...],
              interval_s: float, history_s: float, timeout_s: float, log_level: str) -> None:
    """Serve a status page at http://BIND:PORT/ until Ctrl-C: cluster health, data nodes,
    queues with depth and rates over the last minutes, dead letters; it refreshes itself.

    The master is sampled every --interval-s (one Status request); /api/state is the same
    as JSON. With a secure cluster it uses the client key of --keys / BLIZZARD_KEYS. When
    the master does not answer, the page says so and shows the last figures it had.
    """
    from blizzard.client.core import Client
    from blizzard.dashboard.sampler import History, Sampler, check_history
    from blizzard.dashboard.server import make_server
    from blizzard.net.keys import resolve as resolve_keys
    from blizzard.wire.errors import InvalidArgument

    try:
        check_history(interval_s, history_s)
    except InvalidArgument as exc:
        raise click.UsageError(f"--history-s and --interval-s: {exc.message}") from None
    logging.basicConfig(level=getattr(logging, log_level.upper()),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    keys = resolve_keys(None, "client")  # a bad key directory fails here, not in the thread
    history = History(interval_s, history_s)
    try:
        server = make_server(bind, port, history, master, allow_hosts=allow_hosts)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {bind}:{port}: {exc.strerror or exc}") \
            from None
    sampler = Sampler(lambda: Client(master, timeout_s=timeout_s, keys=keys or ""),
                      history).start()

    def stop(signum: int, frame: Any) -> None:  # shutdown() waits for serve_forever: not here
        threading.Thread(target=server.shutdown, daemon=True).start()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    host, real_port = server.server_address[:2]
    click.echo(f"dashboard of {master} at http://{host!s}:{real_port}/ ; Ctrl-C stops")
    try:
        server.serve_forever()
    finally:
        server.server_close()
        sampler.stop()
        click.echo("stopped")
