"""Every llmfabric name that benchmarks/ and scripts/ import exists.

The suite never runs those scripts, so a rename or a moved module broke them silently
(benchmarks/pd_plan_item.py imported `newest_plan` for weeks after it became
`newest_plans`). Read from the AST, function-level imports included; nothing in the
scripts runs.
"""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT_DIRS = ("benchmarks", "scripts")


def llmfabric_imports(path: pathlib.Path) -> list[tuple[str, str | None, int]]:
    """(module, name or None for a plain `import`, line) of each llmfabric import."""
    out: list[tuple[str, str | None, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "llmfabric" or node.module.startswith("llmfabric.")):
            out += [(node.module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [(alias.name, None, node.lineno) for alias in node.names
                    if alias.name == "llmfabric" or alias.name.startswith("llmfabric.")]
    return out


def unresolved(path: pathlib.Path) -> list[str]:
    bad = []
    for module, name, line in llmfabric_imports(path):
        where = f"{path.name}:{line}"
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            bad.append(f"{where}: {module}: {exc}")
            continue
        if name is None or name == "*" or hasattr(mod, name):
            continue
        try:  # a submodule named in `from package import submodule`
            importlib.import_module(f"{module}.{name}")
        except ImportError:
            bad.append(f"{where}: {module} has no {name}")
    return bad


def _scripts() -> list[pathlib.Path]:
    return sorted(p for d in SCRIPT_DIRS for p in (ROOT / d).rglob("*.py"))


def test_the_scripts_are_found() -> None:
    names = {p.name for p in _scripts()}
    assert {"sim_e2e.py", "gossip_scale.py", "pd_plan_item.py"} <= names


@pytest.mark.parametrize("path", _scripts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_llmfabric_import_of_a_script_resolves(path: pathlib.Path) -> None:
    assert unresolved(path) == []


def test_a_missing_name_or_module_is_caught(tmp_path: pathlib.Path) -> None:
    f = tmp_path / "bench.py"
    f.write_text("from llmfabric.routing.pd_plan import newest_plans, newest_plan\n"
                 "def main():\n    import llmfabric.no_such_module\n"
                 "from llmfabric import sim\n")
    assert unresolved(f) == [
        "bench.py:1: llmfabric.routing.pd_plan has no newest_plan",
        "bench.py:3: llmfabric.no_such_module: No module named 'llmfabric.no_such_module'",
    ]
