"""What the ``blizzard`` commands share: exit codes, address type, common options."""

from __future__ import annotations

import logging
from typing import Any

import click

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2

MASTER_HELP = "Master address (env BLIZZARD_MASTER)."
DEFAULT_MASTER = "tcp://127.0.0.1:5555"


class Address(click.ParamType):
    """A ZeroMQ TCP address such as tcp://127.0.0.1:5555."""

    name = "tcp://HOST:PORT"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        value = str(value)
        host, sep, port = value.removeprefix("tcp://").rpartition(":")
        if not value.startswith("tcp://") or not sep or not host or not port.isdigit() \
                or not 0 <= int(port) < 65536:
            self.fail(f"{value!r} is not an address like tcp://127.0.0.1:5555", param, ctx)
        return value


ADDRESS = Address()


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper()),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


log_level = click.option("--log-level", default="info", show_default=True,
                         type=click.Choice(["debug", "info", "warning", "error"]),
                         help="Logging verbosity.")
master_opt = click.option("--master", "master", type=ADDRESS, envvar="BLIZZARD_MASTER",
                          default=DEFAULT_MASTER, show_default=True, help=MASTER_HELP)
timeout_opt = click.option("--timeout-s", default=10.0, show_default=True,
                           type=click.FloatRange(0.1), help="Give up on an unresponsive master "
                           "after this long (requests are retried meanwhile).")


