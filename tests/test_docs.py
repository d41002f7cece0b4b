"""The documentation: the architecture page names every module there is and no module that is
gone, and the site builds with ``mkdocs build --strict`` (no broken link, no page left out)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
FOLDERS = ("blizzard", "master", "datanode", "bench", "chaos")


def code_map() -> set[Path]:
    """Every module the architecture page names: each `folder/.../name.py` in backticks."""
    text = ARCHITECTURE.read_text()
    pattern = rf"`((?:{'|'.join(FOLDERS)})/[\w/]*\.py)`"
    return {ROOT / name for name in re.findall(pattern, text)}


def test_every_module_is_on_the_architecture_page():
    named = code_map()
    missing = [str(path.relative_to(ROOT))
               for folder in FOLDERS
               for path in sorted((ROOT / folder).rglob("*.py"))
               if path not in named
               and not (path.name == "__init__.py" and path.stat().st_size < 200)]  # a marker
    assert not missing, f"modules missing from docs/architecture.md: {missing}"


def test_the_architecture_page_names_no_module_that_is_gone():
    gone = sorted(str(path.relative_to(ROOT)) for path in code_map() if not path.exists())
    assert not gone, f"docs/architecture.md names missing files: {gone}"


def test_the_code_map_reads_what_it_should():
    """The test above could pass on an empty page: the map must name a module of every folder."""
    named = {path.relative_to(ROOT).parts[0] for path in code_map()}
    assert named == set(FOLDERS)


def test_the_site_builds_strictly(tmp_path):
    """``mkdocs build --strict``, in process: every warning (a broken link or anchor, a page left
    out of the navigation, a missing image) aborts the build, and the test with it."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    site = tmp_path / "site"
    build(load_config(config_file=str(ROOT / "mkdocs.yml"), strict=True, site_dir=str(site)))
    assert (site / "index.html").exists()
    assert (site / "architecture" / "index.html").exists()


def test_no_page_points_outside_the_repository():
    """A link or path such as ``../shared/...`` names something a reader of the repository
    does not have."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    outside = [f"{page.relative_to(ROOT)}: {m.group(0)}"
               for page in pages
               for m in re.finditer(r"\.\./[\w./-]+", page.read_text())
               if not (page.parent / m.group(0)).resolve().is_relative_to(ROOT)]
    assert not outside, outside


def test_the_readme_links_resolve():
    """The README is not part of the site, so the build does not check its links: every
    relative link must name a file of the repository, and an anchor a heading of that file."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text()):
        if re.match(r"\w+://", target):
            continue
        path, _, anchor = target.partition("#")
        if not (ROOT / path).exists():
            broken.append(target)
        elif anchor:
            headings = re.findall(r"^#+ (.+)$", (ROOT / path).read_text(), re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h.lower()).strip().replace(" ", "-") for h in headings}
            if anchor not in slugs:
                broken.append(target)
    assert not broken, broken


def code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, re.M | re.S)


def test_the_site_home_page_has_the_readmes_quick_start():
    """The home page has the quick start and a first session of its own, and its quick start
    is the README's, word for word (two commands: scripts/demo and scripts/test)."""
    readme = (ROOT / "README.md").read_text()
    home = (ROOT / "docs" / "index.md").read_text()
    start = readme.split("## Quick start", 1)[1]
    quick = code_blocks(start)[0]
    assert [line.split()[0] for line in quick.splitlines() if not line.startswith(" ")] == \
        ["scripts/demo", "scripts/test"]
    assert "## Quick start" in home and "## A first session" in home
    assert quick == code_blocks(home.split("## Quick start", 1)[1])[0]
    first = home.split("## A first session", 1)[1]
    assert "blizzard cluster" in first and "from blizzard import Client" in first
