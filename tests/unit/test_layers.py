"""The import graph of src/llmfabric follows the layer order of docs/architecture.md.

Read from the AST (nothing is imported): every runtime import between llmfabric modules,
function-level imports included, imports under `if TYPE_CHECKING:` excluded (they make no
runtime edge). A layer is a first-level package (or module: clock, __main__). Rules:
- a module imports only its own layer or a layer of a LOWER rank (siblings of the same rank
  stay independent of each other: agent does not import routing);
- no import cycle between modules, inside a layer either;
- every layer has a rank (a new package must be placed in the order on purpose);
- every package's __init__ docstring names each of its modules and subpackages.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"
ROOT = "llmfabric"

# docs/architecture.md, "Layer order": lower ranks never import higher or equal ones.
RANKS: dict[str, int] = {
    ROOT: 0, "clock": 0, "untrusted": 0, "yamlfile": 0,
    "identity": 1, "traces": 1, "kvcompress": 1,
    "net": 2, "registry": 2, "sim": 2, "dataplane": 2,
    "membership": 3, "testing": 3, "accounts": 3, "bench": 3, "scheduler": 3, "dashboard": 3,
    "telemetry": 3,
    "gossip": 4, "agent": 4, "routing": 4, "launch": 4, "engines": 4,
    "ingress": 5,
    "apis": 6, "tenancy": 6, "forward": 6,
    "front": 7,
    "batch": 8,
    "node": 9,
    "controller": 10,
    "cli": 11,
    "__main__": 12,
}

Graph = dict[str, set[str]]


def _modules(src: pathlib.Path) -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted((src / ROOT).rglob("*.py")):
        name = ".".join(path.relative_to(src).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _resolve(name: str, modules: dict[str, pathlib.Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(src: pathlib.Path = SRC) -> Graph:
    modules = _modules(src)
    graph: Graph = {}
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        typing_only = {
            id(node)
            for stmt in ast.walk(tree)
            if isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.dump(stmt.test)
            for body in stmt.body
            for node in ast.walk(body)
        }
        deps: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = mod.split(".")
                    pkg = parts if path.name == "__init__.py" else parts[:-1]
                    base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
                names = [f"{base}.{a.name}" for a in node.names]
            for name in names:
                if name == ROOT or name.startswith(ROOT + "."):
                    target = _resolve(name, modules)
                    if target is not None and target != mod:
                        deps.add(target)
        graph[mod] = deps
    return graph


def layer(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_imports(graph: Graph, ranks: dict[str, int]) -> list[str]:
    """'a -> b' for each import into a layer of the same or a higher rank."""
    bad = []
    for mod, deps in sorted(graph.items()):
        for dep in sorted(deps):
            a, b = layer(mod), layer(dep)
            if a != b and ranks[b] >= ranks[a]:
                bad.append(f"{mod} ({a}, rank {ranks[a]}) -> {dep} ({b}, rank {ranks[b]})")
    return bad


def cycles(graph: Graph) -> list[list[str]]:
    """Strongly connected components of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


@pytest.fixture(scope="module")
def graph() -> Graph:
    return import_graph()


def test_every_layer_has_a_rank(graph: Graph) -> None:
    assert {layer(m) for m in graph} - set(RANKS) == set()


def test_no_import_into_a_higher_or_sibling_layer(graph: Graph) -> None:
    assert upward_imports(graph, RANKS) == []


def test_no_import_cycles(graph: Graph) -> None:
    assert cycles(graph) == []


def test_the_graph_is_read(graph: Graph) -> None:
    # Guards the checks above against passing on an empty or unresolved graph.
    assert "llmfabric.membership.swim" in graph["llmfabric.gossip.agent"]
    assert "llmfabric.registry.replica" in graph["llmfabric.gossip.agent"]


def test_checks_catch_an_upward_import_and_a_cycle(tmp_path: pathlib.Path) -> None:
    pkg = tmp_path / ROOT
    for sub in ("membership", "gossip"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "gossip" / "config.py").write_text("from llmfabric.membership import swim\n")
    (pkg / "membership" / "swim.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from llmfabric.gossip.agent import X\n"
        "def f():\n    from llmfabric.gossip.config import Y\n"
    )
    (pkg / "gossip" / "agent.py").write_text("from . import config\n")
    g = import_graph(tmp_path)
    assert g["llmfabric.membership.swim"] == {"llmfabric.gossip.config"}  # not the typing one
    assert g["llmfabric.gossip.agent"] == {"llmfabric.gossip.config"}
    assert upward_imports(g, RANKS) == [
        "llmfabric.membership.swim (membership, rank 3) -> llmfabric.gossip.config "
        "(gossip, rank 4)"
    ]
    assert cycles(g) == [["llmfabric.gossip.config", "llmfabric.membership.swim"]]


def test_every_package_docstring_maps_all_its_files() -> None:
    missing = {}
    for init in sorted((SRC / ROOT).rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        names = [p.stem for p in init.parent.glob("*.py") if p.name != "__init__.py"]
        names += [p.name for p in init.parent.iterdir() if (p / "__init__.py").is_file()]
        if gone := sorted(n for n in names if n not in doc):
            missing[str(init.parent.relative_to(SRC))] = gone
    assert missing == {}
