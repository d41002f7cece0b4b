"""Write docs/cli.md, the CLI reference: every command's ``--help``, as ``blizzard`` prints it.

The page is made from the commands themselves, so it cannot drift from them;
``tests/test_cli_reference.py`` makes it again in memory and fails when the committed page
differs. Run after changing a command, an option or a help text:

    .venv/bin/python scripts/cli_reference.py            # rewrites docs/cli.md
    .venv/bin/python scripts/cli_reference.py --check    # exit 1 if docs/cli.md is stale
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import click
from click.testing import CliRunner

from blizzard.cli.common import EXIT_EMPTY, EXIT_ERROR, EXIT_USAGE
from blizzard.cli.config import name_env_vars
from blizzard.cli.main import cli
from master.cli import promote_command

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "cli.md"
SCRIPT = "scripts/cli_reference.py"
# What --help prints in any terminal of 80 columns or more (click wraps at min(columns, 80) - 2),
# so the page does not depend on the terminal it was made in.
WIDTH = 78
# Commands reached another way than through a group's list: `blizzard master promote` is
# `blizzard master` given `promote` first (master/cli.py, MasterCommand).
EXTRA = {("master",): {"promote": promote_command}}

HEADER = f"""# CLI reference

Every `blizzard` command and subcommand with its `--help`, as the command prints it.
Generated from the commands themselves by `{SCRIPT}`: do not edit this page by
hand. After changing a command, an option or a help text, run
`.venv/bin/python {SCRIPT}`; `tests/test_cli_reference.py` fails while this page
and the commands' `--help` differ.

Every option can also be set from the `BLIZZARD_*` environment variable its help names (the
servers also read a TOML `--config` file: [Operations](operations.md)). Exit codes: 0 ok,
{EXIT_ERROR} an error reported by the cluster (one line naming the error class), {EXIT_USAGE} bad
usage, {EXIT_EMPTY} `dequeue` found the queue empty. How the commands fit together, with
examples: the [Guide](guide.md#the-command-line-running-a-cluster-by-hand).
"""


def commands() -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command under ``blizzard`` (the root first), as (its path of names, the command),
    each group followed by its subcommands, in ``--help``'s order; hidden ones left out."""
    stack: list[tuple[tuple[str, ...], click.Command]] = [((), cli)]
    while stack:
        path, command = stack.pop()
        yield path, command
        subs = dict(EXTRA.get(path, {}))
        if isinstance(command, click.Group):
            ctx = click.Context(command, info_name=path[-1] if path else "blizzard")
            subs.update((name, command.commands[name]) for name in command.list_commands(ctx))
        stack.extend(((*path, name), sub) for name, sub in sorted(subs.items(), reverse=True)
                     if not sub.hidden)


def help_text(path: tuple[str, ...]) -> str:
    """What ``blizzard PATH --help`` prints, run in process as ``blizzard`` runs it, with no
    ``BLIZZARD_*`` variable of the environment at hand."""
    unset = {name: None for name in os.environ if name.startswith("BLIZZARD_")}
    result = CliRunner(env=unset).invoke(cli, [*path, "--help"], prog_name="blizzard",
                                         terminal_width=WIDTH)
    if result.exit_code != 0:
        raise RuntimeError(f"blizzard {' '.join(path)} --help exited {result.exit_code}: "
                           f"{result.output}{result.exception!r}")
    return result.output


def anchor(path: tuple[str, ...]) -> str:
    """The heading's anchor, as MkDocs makes it (lower case, spaces as hyphens)."""
    return "-".join(("blizzard", *path))


def summary(command: click.Command) -> str:
    """The command's first sentence, as its group's ``--help`` lists it, fit for a table cell."""
    text = command.get_short_help_str(limit=90).replace("|", "/")
    if text.count("`") % 2:  # cut inside a code span: end it
        text = text.removesuffix("...") + "`..."
    return text


def reference() -> str:
    """The whole page, docs/cli.md."""
    name_env_vars(cli)  # as blizzard.cli.main.main does before it runs a command
    found = list(commands())
    rows = [f"| [`blizzard {' '.join(path)}`](#{anchor(path)}) | {summary(command)} |"
            for path, command in found if path]
    sections = []
    for path, _ in found:
        level = "##" if len(path) <= 1 else "###"  # a group's subcommands under it
        sections.append(f"{level} {' '.join(('blizzard', *path))}\n\n"
                        f"```text\n{help_text(path).rstrip()}\n```\n")
    table = "| command | what it does |\n|---|---|\n" + "\n".join(rows) + "\n"
    return "\n".join([HEADER, table, *sections])


def main(argv: list[str]) -> int:
    page = reference()
    if argv == ["--check"]:
        if PAGE.exists() and PAGE.read_text() == page:
            return 0
        print(f"{PAGE.relative_to(ROOT)} differs from the commands' --help: run "
              f".venv/bin/python {SCRIPT}", file=sys.stderr)
        return 1
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    PAGE.write_text(page)
    print(f"wrote {PAGE.relative_to(ROOT)}: {page.count('```text')} commands")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
