"""The README's code map names every module there is, and no module that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = {"`blizzard/`": "blizzard", "`master/`": "master", "`datanode/`": "datanode",
            "Elsewhere": ""}


def code_map() -> set[Path]:
    """Every ``.py`` file the code map names, resolved against its section's folder (or, in a
    row of "Elsewhere" that starts with a folder such as `chaos/`, against that folder)."""
    text = (ROOT / "README.md").read_text()
    text = text[text.index("## Code map"):]
    text = text[:text.index("\n## ", 1)]
    named: set[Path] = set()
    folder = None
    for line in text.splitlines():
        for heading, where in SECTIONS.items():
            if line.startswith(heading):
                folder = where
        row = re.match(r"\| `([\w/.]+/)` \|", line)
        base = ROOT / (row.group(1) if row and not folder else folder or "")
        if folder is not None:
            named |= {base / name for name in re.findall(r"`([\w/]+\.py)`", line)}
    return named


def test_every_module_is_in_the_code_map():
    named = code_map()
    missing = [str(path.relative_to(ROOT))
               for folder in ("blizzard", "master", "datanode", "bench", "chaos")
               for path in sorted((ROOT / folder).rglob("*.py"))
               if path not in named
               and not (path.name == "__init__.py" and path.stat().st_size < 200)]  # a marker
    assert not missing, f"modules missing from the README's code map: {missing}"


def test_the_code_map_names_no_module_that_is_gone():
    gone = sorted(str(path.relative_to(ROOT)) for path in code_map() if not path.exists())
    assert not gone, f"the README's code map names missing files: {gone}"
