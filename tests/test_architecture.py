"""The package's import structure, read from the source with ``ast`` (nothing is imported).

What a reader of the code relies on: ``analysis/``'s sub-packages form layers that import one way
only (so a sub-package can be read, tested and replaced from the layers below it up), no module
reaches into another package's underscore modules or another module's private names (those may
change without notice), no import cycles, and the CLI calls only the public ``nemo_telemetry.analysis``
API. Every import counts, including those inside functions: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nemo_telemetry"

# The sub-packages of nemo_telemetry.analysis from the bottom up: each may import those before it,
# never one after it (nor one of the same rank).
LAYERS = (("settings",), ("model",), ("kernels",), ("store",), ("ingestion",), ("decode",), ("goodput",), ("findings",),
          ("engines", "monitor", "views"))


@dataclass
class Imports:
    """Every module of a package tree and what each imports (module -> {module it imports})."""

    modules: dict[str, Path]
    edges: dict[str, set[str]] = field(default_factory=dict)
    names: list[tuple[str, str, str]] = field(default_factory=list)  # (importer, module, name) of `from x import y`


def is_package(imports: Imports, module: str) -> bool:
    return imports.modules.get(module, Path()).name == "__init__.py"


def read_imports(root: Path) -> Imports:
    """Parse every ``.py`` under ``root`` (a package directory) into its import edges."""
    top = root.name
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = (top, *path.relative_to(root).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    imports = Imports(modules)
    for module, path in modules.items():
        edges = imports.edges.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == top:
                        edges.add(alias.name if alias.name in modules else alias.name.rsplit(".", 1)[0])
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(imports, module, node)
                if target.split(".")[0] != top:
                    continue
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    edges.add(full if full in modules else target)
                    if full not in modules:
                        imports.names.append((module, target, alias.name))
        edges.discard(module)
    return imports


def _resolve(imports: Imports, module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package(imports, module) else module.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def module_cycles(imports: Imports, skip_prefix: str) -> list[list[str]]:
    """Import cycles between modules (those under ``skip_prefix`` left out). An edge from inside a
    package to its own ``__init__`` is not counted: that is the package re-exporting its modules."""
    graph = {m: {d for d in ds if d in imports.modules and not (is_package(imports, d) and m.startswith(d + "."))}
             for m, ds in imports.edges.items() if not m.startswith(skip_prefix)}
    return _cycles(graph)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in done:
                visit(nxt, path + [nxt])
        done.add(node)

    for start in sorted(graph):
        if start not in done:
            visit(start, [start])
    return cycles


@dataclass(frozen=True, order=True)
class Edge:
    """One import from sub-package ``a`` of the parent package into sub-package ``b``."""

    module: str
    target: str
    a: str
    b: str


def sub_package(imports: Imports, module: str, parent: str) -> str | None:
    """The sub-package of ``parent`` that ``module`` lies in, its ``__init__`` included (``None`` for
    ``parent``'s own loose modules)."""
    if not module.startswith(parent + "."):
        return None
    first = module[len(parent) + 1:].split(".")[0]
    return first if is_package(imports, f"{parent}.{first}") else None


def cross_edges(imports: Imports, parent: str) -> list[Edge]:
    """Imports from one sub-package of ``parent`` into another."""
    out = []
    for module, targets in imports.edges.items():
        for target in targets:
            a, b = sub_package(imports, module, parent), sub_package(imports, target, parent)
            if a and b and a != b:
                out.append(Edge(module, target, a, b))
    return sorted(out)


def package_loops(edges: list[Edge]) -> list[list[str]]:
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.a, set()).add(edge.b)
    return _cycles(graph)


def layer_violations(edges: list[Edge], layers) -> list[str]:
    rank = {name: i for i, group in enumerate(layers) for name in group}
    bad = []
    for edge in edges:
        if edge.a not in rank or edge.b not in rank:
            bad.append(f"{edge.module} -> {edge.target}: {edge.a if edge.a not in rank else edge.b} is in no layer")
        elif rank[edge.b] >= rank[edge.a]:
            bad.append(f"{edge.module} -> {edge.target}: {edge.b} is not below {edge.a}")
    return bad


def underscore_modules_across(edges: list[Edge]) -> list[str]:
    """Imports of an underscore module from outside the package that holds it."""
    return [f"{e.module} <- {e.target}" for e in edges
            if e.target.rsplit(".", 1)[-1].startswith("_") and not e.module.startswith(e.target.rsplit(".", 1)[0] + ".")]


def private_names(imports: Imports) -> list[str]:
    """``from x import _y`` where ``_y`` is a name (not a module) and ``x`` is another module."""
    return [f"{m} <- {t}.{n}" for m, t, n in imports.names
            if n.startswith("_") and not n.startswith("__") and t != m]


def cli_outside_public_api(imports: Imports, public: set[str]) -> list[str]:
    """CLI imports of ``nemo_telemetry.analysis`` that are not names of its ``__all__``."""
    bad = []
    for module, targets in imports.edges.items():
        if not module.startswith("nemo_telemetry.cli"):
            continue
        bad += [f"{module} -> {t}" for t in targets if t.startswith("nemo_telemetry.analysis.")]
    bad += [f"{m} <- {t}.{n}" for m, t, n in imports.names
            if m.startswith("nemo_telemetry.cli") and t == "nemo_telemetry.analysis" and n not in public]
    return sorted(bad)


def analysis_public_names() -> set[str]:
    tree = ast.parse((PACKAGE / "analysis" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("nemo_telemetry/analysis/__init__.py has no __all__")


@pytest.fixture(scope="module")
def imports() -> Imports:
    found = read_imports(PACKAGE)
    # The walk saw the package: many modules, most of them importing others of it.
    assert len(found.modules) > 100 and sum(bool(e) for e in found.edges.values()) > 80
    return found


ANALYSIS = "nemo_telemetry.analysis"


def test_no_import_cycles_between_modules(imports):
    # cli/ is left out: its command modules and the Typer app register each other.
    assert module_cycles(imports, "nemo_telemetry.cli") == []


def test_analysis_sub_packages_import_one_way(imports):
    edges = cross_edges(imports, ANALYSIS)
    assert len(edges) > 50  # the layers do use each other; the rule below has something to judge
    assert package_loops(edges) == []
    assert layer_violations(edges, LAYERS) == []
    present = {p.name for p in (PACKAGE / "analysis").iterdir() if (p / "__init__.py").exists()}
    assert present == {name for group in LAYERS for name in group}, "a sub-package missing from LAYERS"


def test_no_sub_package_imports_another_ones_underscore_modules(imports):
    assert underscore_modules_across(cross_edges(imports, ANALYSIS)) == []


def test_no_private_names_imported_across_modules(imports):
    assert imports.names, "no `from x import y` seen"
    assert private_names(imports) == []


def test_cli_uses_only_the_public_analysis_api(imports):
    public = analysis_public_names()
    assert any(t == ANALYSIS for m, t, _ in imports.names if m.startswith("nemo_telemetry.cli"))
    assert cli_outside_public_api(imports, public) == []


def test_instrument_side_never_imports_the_analysis_or_the_cli(imports):
    bad = [f"{m} -> {t}" for m, ts in imports.edges.items() if m.startswith("nemo_telemetry.instrument")
           for t in ts if t.startswith(("nemo_telemetry.analysis", "nemo_telemetry.cli"))]
    assert bad == []


def test_analysis_sub_packages_never_import_the_analysis_package_itself(imports):
    """``nemo_telemetry.analysis`` loads every sub-package on demand: importing it from inside one
    would hide a dependency (and a loop) from the rules above."""
    bad = [m for m, ts in imports.edges.items() if sub_package(imports, m, ANALYSIS) and ANALYSIS in ts]
    assert bad == []


def test_the_rules_find_what_they_look_for(tmp_path):
    """Each rule above, on a small package that breaks it, names the offence."""
    root = tmp_path / "nemo_telemetry"
    files = {
        "__init__.py": "",
        "analysis/__init__.py": "__all__ = ['ok']\n",
        "analysis/model/__init__.py": "",
        "analysis/model/_inner.py": "X = 1\n",
        "analysis/model/schema.py": "from nemo_telemetry.analysis.store import W\n",  # the package's own __init__
        "analysis/store/__init__.py": "W = 1\n",
        "analysis/store/dataset.py": "from nemo_telemetry.analysis.model import _inner\n",
        "analysis/store/read.py": "from .dataset import _hidden\n",
        "analysis/store/a.py": "def f():\n    from . import b\n",
        "analysis/store/b.py": "from nemo_telemetry.analysis.store import a\n",
        "cli/__init__.py": "",
        "cli/app.py": "from nemo_telemetry.analysis import ok, not_public\nfrom nemo_telemetry.analysis.store import read\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    found = read_imports(root)
    edges = cross_edges(found, ANALYSIS)
    assert module_cycles(found, "nemo_telemetry.cli") == [
        ["nemo_telemetry.analysis.store.a", "nemo_telemetry.analysis.store.b", "nemo_telemetry.analysis.store.a"]]
    assert package_loops(edges) == [["model", "store", "model"]]
    assert layer_violations(edges, LAYERS) == [
        "nemo_telemetry.analysis.model.schema -> nemo_telemetry.analysis.store: store is not below model"]
    assert underscore_modules_across(edges) == [
        "nemo_telemetry.analysis.store.dataset <- nemo_telemetry.analysis.model._inner"]
    assert private_names(found) == ["nemo_telemetry.analysis.store.read <- nemo_telemetry.analysis.store.dataset._hidden"]
    assert cli_outside_public_api(found, {"ok"}) == [
        "nemo_telemetry.cli.app -> nemo_telemetry.analysis.store.read",
        "nemo_telemetry.cli.app <- nemo_telemetry.analysis.not_public"]
