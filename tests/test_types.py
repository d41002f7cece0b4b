"""mypy over what ships, ``blizzard/``, ``master/`` and ``datanode/``, configured in setup.cfg's
``[mypy]`` sections: the wire format, the client and the master's pure state and its log
strictly, the rest with its annotations (untyped bodies checked too).

mypy runs in process (``mypy.api.run``), so this stays in the unit tier. Its cache is
``.mypy_cache`` at the root (ignored by git): a warm run takes about a second, a cold one
(a fresh checkout) some 10-20 s.
"""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest
from mypy import api

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the config names its packages and its cache relative to the root
    out, err, status = api.run(["--config-file", str(ROOT / "setup.cfg")])
    assert status == 0, f"mypy found type errors (setup.cfg's [mypy]):\n{out}{err}"
    assert out.startswith("Success"), out


def test_mypy_checks_the_servers() -> None:
    """The servers are checked, not only read for their types (``follow_imports = silent``)."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    packages = {name.strip() for name in config["mypy"]["packages"].split(",")}
    assert {"blizzard", "master", "datanode"} <= packages
    silent = [s for s in config.sections() if s.startswith("mypy-")
              and config[s].get("follow_imports") in ("silent", "skip")]
    assert not silent, f"modules not checked: {silent}"
