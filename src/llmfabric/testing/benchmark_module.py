"""`load_benchmark(name)`: a script of the repository's benchmarks/ folder as a module, for the
tests of its pure parts (scripts are not a package: each imports `_common` from beside it)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/`name`.py, imported once (registered under `name` in sys.modules: its
    dataclasses look their module up there)."""
    if name in sys.modules:
        return sys.modules[name]
    if str(_BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(_BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, _BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None, name
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
