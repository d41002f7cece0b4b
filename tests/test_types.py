"""mypy over ``blizzard/``, configured in setup.cfg's ``[mypy]`` sections: the wire format and
the client strictly, the rest with its annotations (untyped bodies checked too).

mypy runs in process (``mypy.api.run``), so this stays in the unit tier. Its cache is
``.mypy_cache`` at the root (ignored by git): a warm run takes about a second, a cold one
(a fresh checkout) some 10-20 s.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mypy import api

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the config names ``blizzard`` and its cache relative to the root
    out, err, status = api.run(["--config-file", str(ROOT / "setup.cfg")])
    assert status == 0, f"mypy found type errors (setup.cfg's [mypy]):\n{out}{err}"
    assert out.startswith("Success"), out
