"""A version a user can pin: ``setup.cfg`` writes it once; ``blizzard --version``,
``blizzard.__version__`` and the master's ``Welcome`` say it; the CHANGELOG's top section is
that version, and says how to upgrade to it."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

from click.testing import CliRunner

import blizzard
from blizzard.cli.main import cli
from blizzard.wire import protocol as p

from support.in_process_master import call, in_process_master

ROOT = Path(__file__).resolve().parent.parent


def written_version() -> str:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return config["metadata"]["version"]


def test_blizzard_version_prints_the_version_setup_cfg_writes() -> None:
    version = written_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    assert blizzard.__version__ == version  # the installed metadata is this checkout's
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"blizzard, version {version}\n"


def test_the_changelogs_top_section_is_this_version_and_says_how_to_upgrade() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## (\S+)", text, re.M)
    assert sections[0] == written_version(), "the newest section is the version being released"
    assert "Unreleased" not in sections
    newest = text.split(f"## {sections[0]}", 1)[1].split("\n## ", 1)[0]
    assert f"### Upgrading from {sections[1]}" in newest


def test_the_master_tells_its_release_in_its_welcome() -> None:
    welcome = call(in_process_master(), p.Hello())
    assert isinstance(welcome, p.Welcome) and welcome.release == blizzard.__version__
