"""The floors of the house: which package may import which, read from the source with ``ast``.

Ground up: ``mpifc.errors``/``mpifc.atomic``/``mpifc.progress`` (utilities), ``circuit``, ``federated``, ``runtime``,
``fedpc``, then ``experiments``/``baselines``/``analysis``/``ngm``, and ``cli`` on top.
``data_prep`` stands beside the floors (it may use the utilities only).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("mpifc", "data_prep")
UTILITIES = {"mpifc.errors", "mpifc.atomic", "mpifc.progress"}
FACADE = "mpifc"  # the package itself: ``__version__``, and ``load``/``simulate`` from mpifc.api on first use


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for root in ROOTS for p in (REPO / root).rglob("*.py")}


def _imports(name: str, path: Path) -> set[str]:
    """Every module of ``mpifc``/``data_prep`` that ``path`` imports, at any depth of the file."""
    out: set[str] = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
                # ``from . import x`` may name a module x
                out.update(f"{mod}.{a.name}" for a in node.names)
            else:
                mod = node.module or ""
                out.update(f"{mod}.{a.name}" for a in node.names)
            out.add(mod)
    return {m for m in out if m.split(".")[0] in ROOTS}


def _resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The module ``target`` names (``pkg.mod.func`` -> ``pkg.mod``), or None if outside."""
    parts = target.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in modules:
            return cand
        parts.pop()
    return None


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = _modules()
    g = {}
    for name, path in mods.items():
        targets = {_resolve(t, mods) for t in _imports(name, path)}
        g[name] = {t for t in targets if t and t != name}
    return g


def floor(module: str) -> str:
    """The package a module belongs to: ``mpifc.circuit.einet.model`` -> ``circuit``."""
    if module in UTILITIES:
        return "utilities"
    if module == FACADE:
        return "facade"
    parts = module.split(".")
    if parts[0] == "data_prep":
        return "data_prep"
    return parts[1] if len(parts) > 1 else "utilities"


def _entry_point(module: str) -> bool:
    # ``python -m data_prep`` / ``python -m mpifc`` start the command line: they may import it.
    return module.endswith("__main__")


def _edges(graph, src_floor: str) -> set[tuple[str, str]]:
    return {(a, b) for a, bs in graph.items() if floor(a) == src_floor and not _entry_point(a) for b in bs}


def test_the_graph_sees_the_floors(graph):
    floors = {floor(m) for m in graph}
    assert {"circuit", "federated", "runtime", "fedpc", "cli", "api", "experiments", "baselines", "analysis",
            "ngm", "data_prep", "utilities", "facade"} <= floors
    # The reader finds imports inside functions too (most heavy imports are local).
    assert "mpifc.fedpc.mpe" in graph["mpifc.fedpc.job"]


def test_the_package_facade_reaches_only_the_api(graph):
    assert graph[FACADE] <= {"mpifc.api"}
    users = {a for a, bs in graph.items() for b in bs if b == "mpifc.api" and floor(a) not in ("facade", "cli")}
    assert not users, sorted(users)


def test_utilities_and_data_prep_import_nothing_of_the_floors(graph):
    for f in ("utilities", "data_prep"):
        bad = {(a, b) for a, b in _edges(graph, f) if floor(b) not in ("utilities", "data_prep", "facade")}
        assert not bad, f"{f} imports upward: {sorted(bad)}"


def test_circuit_imports_nothing_above_it(graph):
    bad = {(a, b) for a, b in _edges(graph, "circuit") if floor(b) not in ("circuit", "utilities", "facade")}
    assert not bad, sorted(bad)


def test_federated_imports_only_circuit(graph):
    bad = {(a, b) for a, b in _edges(graph, "federated")
           if floor(b) not in ("federated", "circuit", "utilities", "facade")}
    assert not bad, sorted(bad)


def test_runtime_imports_no_protocol_and_nothing_above(graph):
    above = {"federated", "fedpc", "experiments", "baselines", "analysis", "ngm", "cli", "circuit", "data_prep", "api"}
    bad = {(a, b) for a, b in _edges(graph, "runtime") if floor(b) in above}
    assert not bad, sorted(bad)


def test_fedpc_sits_on_runtime_federated_circuit_and_data_prep(graph):
    allowed = {"fedpc", "runtime", "federated", "circuit", "data_prep", "utilities", "facade"}
    bad = {(a, b) for a, b in _edges(graph, "fedpc") if floor(b) not in allowed}
    assert not bad, sorted(bad)
    users = {a for a, bs in graph.items() for b in bs if floor(b) == "fedpc" and floor(a) in
             {"runtime", "federated", "circuit", "data_prep", "utilities"}}
    assert not users, sorted(users)


def test_nothing_imports_the_cli(graph):
    bad = {(a, b) for a, bs in graph.items() for b in bs
           if floor(b) == "cli" and floor(a) != "cli" and not _entry_point(a)}
    assert not bad, sorted(bad)


def test_no_import_circle(graph):
    # Tarjan's strongly connected components, iteratively: any component of two or more modules
    # is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    circles = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    circles.append(sorted(comp))
    assert not circles, circles


def test_argparse_lives_only_in_the_cli_package():
    pattern = re.compile(r"^\s*(import argparse|from argparse import)", re.M)
    found = sorted(str(p.relative_to(REPO)) for root in ROOTS for p in (REPO / root).rglob("*.py")
                   if pattern.search(p.read_text()) and "mpifc/cli/" not in p.as_posix())
    assert not found, f"argparse outside mpifc/cli/: {found}"
