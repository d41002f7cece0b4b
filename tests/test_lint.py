"""ruff over everything in the repository, with the project's settings (pyproject.toml's
``[tool.ruff]``: pyflakes, pycodestyle, import order, bugbear, pyupgrade). ``scripts/test``
runs it before the suite in every tier; this test holds the settings and the tree to it and
shows the check can fail. It starts ruff's binary, so it is in the cluster tier."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.cluster


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_ruff_passes_over_the_tree() -> None:
    done = ruff("--quiet", ".")
    assert done.returncode == 0, f"ruff found problems:\n{done.stdout}{done.stderr}"


def test_the_rule_sets_the_issue_named_are_on() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    assert {"F", "E", "W", "I", "B", "UP"} <= set(config["lint"]["select"])
    assert config["line-length"] == 100 and not config["lint"].get("ignore")


def test_scripts_test_runs_ruff_before_the_suite() -> None:
    script = (ROOT / "scripts" / "test").read_text()
    assert script.index("-m ruff check") < script.index("-m pytest")


def test_a_finding_fails_the_check(tmp_path: Path) -> None:
    """The same settings on a file with an unused import and a zip without strict=."""
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "bad.py").write_text("import os\n\nprint(list(zip([1], [2])))\n")
    done = ruff("--no-cache", "bad.py", cwd=tmp_path)
    assert done.returncode == 1
    assert "F401" in done.stdout and "B905" in done.stdout
