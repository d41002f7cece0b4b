"""What the command lines share (``blizzard``, ``python -m master``, ``python -m datanode``):
exit codes, the address type, common options, the servers' options, starting and running a
server."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import math
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import click
import zmq

from blizzard.cli.config import config_option, name_env_vars
from blizzard.host.fd_limits import log_fd_limits, raise_fd_limit
from blizzard.host.file_modes import private_process
from blizzard.net.defaults import DEFAULT_MASTER, LOOPBACK
from blizzard.net.keys import missing_advice
from blizzard.net.master_hints import nothing_listens, start_hint
from blizzard.server import logs
from blizzard.wire.errors import BlizzardError, InvalidArgument, MasterUnavailable, MissingKeys
from blizzard.wire.queue_settings import MAX_QUEUE_NAME, QUEUE_NAME_CHARS, check_queue_name

EXIT_ERROR = 1  # the cluster refused or failed (one line naming the error class)
EXIT_USAGE = 2  # bad arguments
EXIT_EMPTY = 3  # ``dequeue`` found the queue empty

MASTER_ENV = "BLIZZARD_MASTER"
MASTER_HELP = "Master address; several, comma-separated, for a primary and its standby."
KEYS_ENV = "BLIZZARD_KEYS"
TIMEOUT_ENV = "BLIZZARD_TIMEOUT_S"

log = logging.getLogger(__name__)


class Address(click.ParamType):
    """A ZeroMQ TCP address such as tcp://127.0.0.1:5555."""

    name = "tcp://HOST:PORT"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        value = str(value)
        host, sep, port = value.removeprefix("tcp://").rpartition(":")
        if not value.startswith("tcp://") or not sep or not host or not port.isdigit() \
                or not 0 <= int(port) < 65536:
            self.fail(f"{value!r} is not an address like {DEFAULT_MASTER}", param, ctx)
        return value


ADDRESS = Address()


class Masters(Address):
    """One master address, or several comma-separated (a primary and its standby); a sharded
    queue's shards separated by spaces, in shard order."""

    name = "tcp://HOST:PORT[,...][ ...]"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        return " ".join(",".join(super(Masters, self).convert(a.strip(), param, ctx)
                                 for a in shard.split(","))
                        for shard in str(value).split())


def stop_on_signals() -> threading.Event:
    """An event SIGTERM or SIGINT (Ctrl-C) sets: a foreground command's loop ends on it."""
    stopping = threading.Event()

    def stop(signum: int, frame: Any) -> None:
        stopping.set()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return stopping


def config_defaults(config: type) -> dict[str, Any]:
    """A config dataclass's defaults by field name: a server's option defaults, written once."""
    return {f.name: f.default for f in dataclasses.fields(config)}


def server_command(name: str, data_dir_help: str, bind_default: str,
                   cls: type[click.Command] = click.Command,
                   ) -> Callable[[Callable[..., Any]], click.Command]:
    """A server's click command with the options every server has: ``--data-dir``, ``--bind``,
    ``--keys`` / ``--insecure`` (the callback gets ``keys``: a directory, or None),
    ``--metrics-port`` / ``--metrics-addr`` (Prometheus metrics; off unless a port is given),
    ``--log-level``, ``--log-format`` and ``--config`` (a TOML file of option values). Each
    option can also come from ``BLIZZARD_<NAME>_<OPTION>`` (``cli_config``)."""
    def decorate(f: Callable[..., Any]) -> click.Command:
        f = config_option(f)
        f = click.option("--log-format", default="text", show_default=True,
                         type=click.Choice(logs.FORMATS),
                         help="text for people; json: one object per line with time, level, "
                              "logger, message, role, node_id, addr (and exception).")(f)
        f = click.option("--log-level", default="info", show_default=True,
                         type=click.Choice(["debug", "info", "warning", "error"]),
                         help="Logging verbosity.")(f)
        f = click.option("--metrics-addr", default=LOOPBACK, show_default=True,
                         help="Address the metrics endpoint listens on (loopback: only this "
                              "machine may scrape it).")(f)
        f = click.option("--metrics-allow-host", "metrics_allow_hosts", multiple=True,
                         metavar="NAME", help="A host name the metrics endpoint also answers "
                         "to (repeatable): it answers requests whose Host header is its "
                         "address, localhost or an IP address, and refuses other names (a "
                         "web page could otherwise read it by DNS rebinding).")(f)
        f = click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
                         help="Serve Prometheus metrics at http://ADDR:PORT/metrics "
                              "(default: no metrics endpoint; 0 picks a free port).")(f)
        f = click.option("--insecure", is_flag=True, default=False,
                         help="Run without security: no encryption, and anyone who reaches "
                              "the port may do anything. Only for a trusted network.")(f)
        f = click.option("--keys", type=click.Path(file_okay=False), envvar=KEYS_ENV,
                         default=None, help="Key directory made by `blizzard keys generate`. "
                         "Required unless --insecure.")(f)
        f = click.option("--bind", type=ADDRESS, default=bind_default, show_default=True,
                         help="Address to listen on.")(f)
        f = click.option("--data-dir", required=True, type=click.Path(file_okay=False),
                         help=data_dir_help)(f)
        command = click.command(name, cls=cls,
                                context_settings={"help_option_names": ["-h", "--help"]})(f)
        name_env_vars(command, f"BLIZZARD_{name.upper()}")  # the same under `blizzard NAME`
        return command
    return decorate


def security(keys: str | None, insecure: bool) -> str | None:
    """The key directory a server runs with (None: insecure); a usage error unless exactly
    one of ``--keys`` and ``--insecure`` was given, or one of them by a stronger source
    (command line > environment > config file)."""
    if keys and insecure:
        ctx = click.get_current_context()
        unknown = click.core.ParameterSource.DEFAULT
        keys_from = ctx.get_parameter_source("keys") or unknown
        insecure_from = ctx.get_parameter_source("insecure") or unknown
        if keys_from == insecure_from:
            raise click.UsageError("give either --keys or --insecure, not both")
        if insecure_from < keys_from:  # the more explicit source wins
            keys = None  # e.g. an explicit --insecure outranks BLIZZARD_KEYS
    if not keys and not insecure:
        raise click.UsageError("security needs keys: pass --keys DIR (make them with "
                               "`blizzard keys generate DIR`), or --insecure to run without")
    return keys or None


SERVER_MODULES = ("plyvel", "prometheus_client")  # the ``server`` extra (setup.cfg)


def needs_server_extra(role: str) -> None:
    """Stop with one line if the servers' dependencies are not installed: the client, the CLI
    and the worker install without them (``pip install blizzard``)."""
    missing = [m for m in SERVER_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise click.ClickException(
            f"the {role} needs the servers' dependencies ({', '.join(missing)} not installed): "
            "pip install 'blizzard[server]'")


def start(make: Callable[[], Any], role: str, bind: str,
          refusals: tuple[type[Exception], ...] = ()) -> Any:
    """``make()`` a server; what stops it from starting (a port in use, a bad setting, bad
    keys, ``refusals`` such as a damaged WAL) becomes one line and exit code 1, not a
    traceback. The soft descriptor limit is raised to the hard one first."""
    limits = raise_fd_limit()
    private_process()  # data directories 0700, files 0600 (blizzard/host/file_modes.py)
    try:
        server = make()
        log_fd_limits(*limits)  # only once it serves: a refusal is one line, its reason
        return server
    except refusals as exc:
        raise click.ClickException(str(exc)) from None
    except zmq.ZMQError as exc:
        hint = f" — is another {role} running? (choose another port with --bind)" \
            if exc.errno == zmq.EADDRINUSE else ""
        # zmq.strerror, not exc.strerror: pyzmq adds "(addr=...)" to the latter
        raise click.ClickException(f"cannot listen on {bind}: {zmq.strerror(exc.errno or 0)}"
                                   f"{hint}") \
            from None
    except BlizzardError as exc:
        raise click.ClickException(error_line(exc, [], {})) from None
    except OSError as exc:  # the metrics port, the data directory
        raise click.ClickException(str(exc)) from None


def serve(server: Any, role: str) -> None:
    """Run a server until SIGTERM/SIGINT, then close it cleanly; a crash is logged (so it is
    a JSON line too with --log-format json) and exits 1."""
    def stop(signum: int, frame: Any) -> None:
        server.stop()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.serve_forever()
    except Exception:
        log.critical("the %s stopped on an unexpected error", role, exc_info=True)
        raise SystemExit(EXIT_ERROR) from None
    finally:
        server.close()


master_opt = click.option("--master", "master", type=Masters(), envvar=MASTER_ENV,
                          default=DEFAULT_MASTER, show_default=True, help=MASTER_HELP)


def _keys_to_env(ctx: Any, param: Any, value: str | None) -> None:
    if value:
        os.environ[KEYS_ENV] = value  # the client reads it (and so do its child processes)


keys_opt = click.option("--keys", type=click.Path(file_okay=False), envvar=KEYS_ENV,
                        expose_value=False, callback=_keys_to_env,
                        help="The cluster's key directory (`blizzard cluster --data-dir D` "
                             "keeps it in D/keys); the admin key is used for purge, redrive, "
                             "configure and deletes (by a gateway only with --admin).")


class Finite(click.FloatRange):
    """A number within a range; ``nan`` and ``inf`` are refused, also where the range has no
    upper end (a wait of ``nan`` or ``inf`` seconds never ends, or ends in a traceback deep
    in a library; a rate of ``inf`` spins)."""

    unit = "number"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite {self.unit}", param, ctx)
        return number


class Seconds(Finite):
    """A duration in seconds within a range, finite."""

    unit = "number of seconds"


MAX_TIMEOUT_S = 3600.0
timeout_opt = click.option("--timeout-s", default=10.0, show_default=True, envvar=TIMEOUT_ENV,
                           type=Seconds(0.1, MAX_TIMEOUT_S),
                           help="Give up on an unresponsive master after this long (requests "
                                "are retried meanwhile); at most an hour.")


def _queue_name(ctx: Any, param: Any, value: str) -> str:
    try:
        return check_queue_name(value)
    except InvalidArgument as exc:
        raise click.BadParameter(exc.message, ctx, param) from None


queue_arg = click.argument("queue", callback=_queue_name)
QUEUE_NAME_HELP = f"Queue names: 1-{MAX_QUEUE_NAME} of {QUEUE_NAME_CHARS}."


def master_origin(argv: list[str], environ: dict[str, str]) -> str:
    """How the master address was chosen, for a user whose master does not answer."""
    if any(a == "--master" or a.startswith("--master=") for a in argv):
        return "given by --master"
    if environ.get(MASTER_ENV):
        return f"taken from {MASTER_ENV}"
    return f"the default (neither --master nor {MASTER_ENV} was set)"


def error_line(exc: BlizzardError, argv: list[str], environ: dict[str, str]) -> str:
    """The line the command line prints for a library error, with its class, in the command
    line's words: a master not there says where its address came from and how to start one
    (``master_hints``); missing keys say which files, and ``--keys`` (``keys.missing_advice``)."""
    if isinstance(exc, MissingKeys):
        return f"{missing_advice(exc.directory, exc.looked_for, cli=True)} (MissingKeys)"
    text = nothing_listens(exc.addr) if isinstance(exc, MasterUnavailable) and exc.refused \
        else exc.message
    line = f"{text} ({type(exc).__name__})"
    if isinstance(exc, MasterUnavailable):
        line += f"; {start_hint(master_origin(argv, environ), cli=True)}."
    return line
