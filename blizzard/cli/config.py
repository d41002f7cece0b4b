"""Where a command's options come from besides its command line: ``BLIZZARD_*`` environment
variables for every option, and a TOML file (``--config FILE``) for the servers.

Precedence, highest first: command line, environment, config file, built-in default (click's
order for ``envvar`` and ``default_map``).

Variable names follow the command path and the long option name, so they read like the
command: ``blizzard queue stats --json`` <- ``BLIZZARD_QUEUE_STATS_JSON=1``,
``blizzard master --metrics-port`` <- ``BLIZZARD_MASTER_METRICS_PORT``. They are given to each
option explicitly rather than through click's ``auto_envvar_prefix``, which would name them
after Python parameter names (``..._AS_JSON``) and differently under ``python -m master``
than under ``blizzard master``. Options every command shares keep one name everywhere
(``BLIZZARD_MASTER``, ``BLIZZARD_KEYS``, ``BLIZZARD_TIMEOUT_S``).
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from typing import Any

import click

ENV_PREFIX = "BLIZZARD"
MAX_CONFIG_BYTES = 1024 * 1024  # a config file is a page of options: more is no config file
_NOT_CONFIGURABLE = {"help", "version", "config"}


class ConfigError(click.ClickException):
    """Raised when a config file has a key no option has, or a value its option refuses:
    a usage mistake (exit 2) told in one line, without the usage text of a command-line one."""

    exit_code = click.UsageError.exit_code  # 2, as for any usage mistake


def long_name(option: click.Option) -> str:
    """An option's long name with underscores: ``--metrics-port`` -> ``metrics_port``."""
    longs = [o for o in option.opts if o.startswith("--")] or option.opts
    return longs[0].lstrip("-").replace("-", "_")


def name_env_vars(command: click.Command, prefix: str = ENV_PREFIX) -> None:
    """Give every option of ``command`` and of its subcommands its ``BLIZZARD_*`` variable
    (shown in ``--help``); options with a variable of their own keep it. Idempotent."""
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            name_env_vars(sub, f"{prefix}_{name.upper().replace('-', '_')}")
    for param in command.params:
        if isinstance(param, click.Option) and param.name not in ("help", "version"):
            if param.envvar is None:
                param.envvar = f"{prefix}_{long_name(param).upper()}"
            param.show_envvar = True


def config_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--config FILE``: option values from a TOML file, below the command line and the
    environment in precedence."""
    return click.option(
        "--config", type=click.Path(exists=True, dir_okay=False), is_eager=True,
        expose_value=False, callback=_load_config,
        help="TOML file of option values, keys named like the options (data-dir or "
             "data_dir). The command line and BLIZZARD_* variables override it.")(f)


def _load_config(ctx: click.Context, param: click.Parameter, path: str | None) -> None:
    if not path:
        return
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_CONFIG_BYTES + 1)  # bounded: /dev/zero is a "file" too
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config {path} is over {MAX_CONFIG_BYTES // 1024} KiB: not a config "
                          "file of options")
    try:
        doc = tomllib.loads(text.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config {path} is not UTF-8 text: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {path} is not valid TOML: {exc}") from None
    ctx.default_map = {**(ctx.default_map or {}), **config_values(ctx, doc, path)}


def config_values(ctx: click.Context, doc: dict[str, Any], path: str) -> dict[str, Any]:
    """The option values of config ``doc`` by parameter name, each checked like its option:
    a ``ConfigError`` names the first unknown key or wrong value."""
    options = {long_name(o): o for o in ctx.command.params
               if isinstance(o, click.Option) and o.name not in _NOT_CONFIGURABLE}
    values: dict[str, Any] = {}
    for key, value in doc.items():
        option = options.get(key.replace("-", "_"))
        if option is None or option.name is None:
            raise ConfigError(f"config {path}: unknown key {key!r} (known: "
                                   f"{', '.join(sorted(options))})")
        _check_kind(option, key, value, path)
        try:
            option.type_cast_value(ctx, value)
        except click.BadParameter as exc:
            raise ConfigError(f"config {path}: {key} = {value!r}: {exc.message}") from None
        values[option.name] = value
    return values


def _check_kind(option: click.Option, key: str, value: Any, path: str) -> None:
    """TOML has types: a flag takes true/false, a number option a number, others a string."""
    wanted: tuple[type, ...]
    if option.is_flag:
        wanted, name = (bool,), "true or false"
    elif isinstance(option.type, click.types.IntParamType):
        wanted, name = (int,), "an integer"
    elif isinstance(option.type, click.types.FloatParamType):
        wanted, name = (int, float), "a number"
    else:
        wanted, name = (str,), "a string"
    if not isinstance(value, wanted) or (isinstance(value, bool) and bool not in wanted):
        raise ConfigError(f"config {path}: {key} = {value!r}: expected {name}")
