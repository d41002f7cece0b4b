"""The import graph between files: no cycles; the layers (``.importlinter``) hold.

Every module of the packages is read with ``ast``; an import inside a function counts like one
at the top (a cycle through a lazy import is still two files that need each other). Importing
a submodule does not count as importing its package's ``__init__``; ``from pkg import name``
counts as importing ``pkg.name`` where that is a module, else ``pkg``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("blizzard", "master", "datanode", "chaos", "bench")

def modules() -> dict[str, Path]:
    """Module name -> file, for every module of PACKAGES."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _resolve(mods: dict[str, Path], name: str) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The modules (of ``mods``) that module ``name`` imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            dst = _resolve(mods, target)
            if dst and dst != name:
                found.add(dst)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, mods) for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_files():
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_layers_hold():
    """The contracts of ``.importlinter``: blizzard's floors (wire < net < client | server <
    the tools < cli), a client without the servers' code or dependencies, servers apart."""
    # importlinter's pieces, not importlinter.cli.lint_imports: that configures logging,
    # disabling every logger of this process (later tests' caplog would see nothing)
    from importlinter import configuration
    from importlinter.application.use_cases import lint_imports

    configuration.configure()
    assert lint_imports(config_filename=str(ROOT / ".importlinter"), cache_dir=None)


def test_each_package_says_what_it_is_and_may_use():
    for init in sorted((ROOT / "blizzard").rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.splitlines()) >= 2, \
            f"{init} needs a docstring: what it is, what it uses"


def test_the_public_names_keep_working():
    import blizzard
    from blizzard.client import Client as OldPath

    assert blizzard.Client is OldPath
    for name in blizzard.__all__:
        assert getattr(blizzard, name) is not None


def test_the_graph_sees_lazy_imports_and_the_check_sees_cycles():
    g = graph()
    assert "blizzard.local.harness" in g["blizzard.cli.main"]  # imported inside the cluster command
    assert "master.cli" in g["master.__main__"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
