"""The CLI as the documentation shows it: docs/cli.md is the commands' own ``--help`` (made by
``scripts/cli_reference.py``), and every ``blizzard ...`` line of the README's and the site's
examples names a command and options that exist."""

from __future__ import annotations

import difflib
import importlib.util
import re
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "cli_reference.py"


def load_script():
    """scripts/cli_reference.py as a module (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location("cli_reference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference = load_script()


def test_the_cli_reference_is_the_commands_help():
    page = reference.reference()
    committed = reference.PAGE.read_text() if reference.PAGE.exists() else ""
    if committed != page:
        diff = difflib.unified_diff(committed.splitlines(), page.splitlines(),
                                    "docs/cli.md (committed)", "the commands' --help", lineterm="")
        shown = "\n".join(list(diff)[:60])
        pytest.fail("docs/cli.md differs from the commands' --help: run "
                    f".venv/bin/python scripts/cli_reference.py\n{shown}", pytrace=False)


def test_the_reference_has_a_section_for_every_command():
    """Subcommands too, and ``master promote``, which no group lists."""
    page = reference.reference()
    headings = set(re.findall(r"^#{2,3} (blizzard.*)$", page, re.M))
    for expected in ("blizzard", "blizzard enqueue", "blizzard queue create",
                     "blizzard keys add-node", "blizzard master promote", "blizzard wal check"):
        assert expected in headings
    assert len(headings) == len(list(reference.commands()))


def test_the_reference_does_not_depend_on_the_environment(monkeypatch):
    """A variable of the shell the page is made in changes no default it shows, nor the width."""
    before = reference.reference()
    monkeypatch.setenv("BLIZZARD_MASTER", "tcp://10.0.0.1:7000")
    monkeypatch.setenv("BLIZZARD_DEQUEUE_LEASE_S", "99")
    monkeypatch.setenv("COLUMNS", "200")
    assert reference.reference() == before


def command_lines() -> list[tuple[str, str]]:
    """(page, line) for every line of a code block in README.md and docs/ that runs
    ``blizzard``, its comment cut off; docs/cli.md itself left out."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = []
    for page in pages:
        if page == reference.PAGE:
            continue
        for block in re.findall(r"^```[^\n]*\n(.*?)^```", page.read_text(), re.M | re.S):
            for line in block.splitlines():
                line = line.split(" #", 1)[0].strip().removeprefix("$ ")
                if line.startswith("blizzard "):
                    found.append((str(page.relative_to(ROOT)), line))
    return found


def test_the_docs_examples_name_commands_and_options_that_exist():
    """The README and the pages write commands out by hand (a first session, a recipe): each
    must name a real command, a real subcommand (``queue create|config`` names several), and
    options of that command."""
    tree = dict(reference.commands())
    lines = command_lines()
    assert len(lines) > 20, "found too few blizzard lines: the pattern is broken"
    wrong = []
    for page, line in lines:
        words = line.split()[1:]
        path: tuple[str, ...] = ()
        while words and (*path, words[0]) in tree:
            path, words = (*path, words[0]), words[1:]
        command = tree[path]
        if words and "|" in words[0] and isinstance(command, click.Group):
            wrong += [f"{page}: {line}: no {name}" for name in words[0].split("|")
                      if (*path, name) not in tree]
            continue
        if not path:
            wrong.append(f"{page}: {line}: no such command")
            continue
        options = {"-h", "--help"}
        for param in command.params:
            options.update(param.opts + param.secondary_opts)
        wrong += [f"{page}: {line}: blizzard {' '.join(path)} has no {option}"
                  for word in words for option in re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", word)
                  if option not in options]
    assert not wrong, "\n".join(wrong)
