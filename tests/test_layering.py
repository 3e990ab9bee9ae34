"""The house's rules, read from the code (every import at any depth, module- and function-level):

- ``vitviz`` never imports Streamlit, and no module of it imports ``ui`` or ``pages``;
- ``vitviz.io`` imports nothing of vitviz outside ``vitviz.io`` but the shared types (errors, layout, types,
  tensors, settings): it is the floor everything writes through;
- the analyses (``vitviz.analyses``: rollout, flow, distance, maps, tokens, ...), the perturbation protocol
  (``vitviz.perturbation.curves``), the map methods (``vitviz.explainers``) and the front door (``vitviz.lens``) never import
  the runs (``vitviz.runs``), the CLI or figures (``vitviz.figures``);
- at most 12 modules directly under ``vitviz/`` (the rest live in rooms);
- no import circles.

The checker is tested on planted packages: an upward import and a circle each fail it.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOWER = ("analyses", "perturbation", "explainers", "lens")
SHARED = ("errors", "layout", "types", "tensors", "settings")
RUNS_CLI_FIGURES = ("runs", "cli", "figures")


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules (of any package) it imports, resolved to the package's own module names where they are."""
    name = package.name
    mods = {}
    for f in package.rglob("*.py"):
        parts = f.relative_to(package.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    graph = {}
    for mod, f in mods.items():
        deps = set()
        is_pkg = f.name == "__init__.py"
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = mod if is_pkg else mod.rpartition(".")[0]
                for _ in range(max(node.level - 1, 0)):
                    base = base.rpartition(".")[0]
                module = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
                targets = [module] + [f"{module}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                own = t
                while own and own not in mods:
                    own = own.rpartition(".")[0]
                deps.add(own if own else t)
        deps.discard(mod)
        deps.discard(name)
        graph[mod] = deps
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in graph:
        if v not in index:
            visit(v)
    return out


def broken_rules(graph: dict[str, set[str]], pkg: str = "vitviz") -> list[str]:
    def under(mod, room):
        return mod == f"{pkg}.{room}" or mod.startswith(f"{pkg}.{room}.")

    def is_run_cli_figure(dep):
        short = dep.removeprefix(f"{pkg}.")
        return dep.startswith(f"{pkg}.") and short.split(".")[0] in RUNS_CLI_FIGURES

    broken = []
    for mod, deps in graph.items():
        for dep in deps:
            if dep.split(".")[0] in ("streamlit", "ui", "pages"):
                broken.append(f"{mod} imports {dep}")
            if under(mod, "io") and dep.startswith(f"{pkg}.") and not any(under(dep, r) for r in ("io",) + SHARED):
                broken.append(f"{mod} (io) imports {dep}")
            if any(under(mod, room) for room in LOWER) and is_run_cli_figure(dep):
                broken.append(f"{mod} imports {dep} (a run, the CLI or a figure)")
    return broken


def test_vitviz_keeps_its_layering_and_has_no_import_circles():
    graph = import_graph(ROOT / "vitviz")
    assert len(graph) > 60  # the walk saw the package
    assert broken_rules(graph) == []
    assert circles(graph) == []
    top = sorted(p.stem for p in (ROOT / "vitviz").glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) <= 12, top


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "vitviz"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_checker_fails_a_planted_upward_import_and_a_planted_circle(tmp_path):
    clean = {"__init__.py": "", "analyses/__init__.py": "", "analyses/rollout.py": "from ..layout import X\n",
             "layout.py": "X = 1\n", "io/__init__.py": "", "io/atomic.py": "import os\n",
             "cli.py": "from .analyses.rollout import X\n"}
    graph = import_graph(_package(tmp_path / "a", clean))
    assert broken_rules(graph) == [] and circles(graph) == []

    upward = clean | {"analyses/rollout.py": "def f():\n    from ..cli import main\n"}
    assert broken_rules(import_graph(_package(tmp_path / "b", upward))) == [
        "vitviz.analyses.rollout imports vitviz.cli (a run, the CLI or a figure)"]
    io_up = clean | {"io/atomic.py": "from ..layout import X\nfrom ..analyses.rollout import X\n"}
    assert broken_rules(import_graph(_package(tmp_path / "c", io_up))) == [
        "vitviz.io.atomic (io) imports vitviz.analyses.rollout"]
    streamlit = clean | {"layout.py": "import streamlit as st\n"}
    assert broken_rules(import_graph(_package(tmp_path / "d", streamlit))) == ["vitviz.layout imports streamlit"]
    circle = clean | {"layout.py": "def f():\n    from .analyses import rollout\n"}
    assert circles(import_graph(_package(tmp_path / "e", circle))) == [{"vitviz.layout", "vitviz.analyses.rollout"}]
