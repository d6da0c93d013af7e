"""Real engines for the `engine` tests: installed by scripts/install-engines.sh (separate
venvs under ~/.cache/llmfabric-engines, built once per machine) and serving a tiny Llama
built here (tests/engine/tinymodel.py: random weights, a locally trained BPE tokenizer)."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
HOME = pathlib.Path(os.environ.get("LLMFABRIC_ENGINES_HOME",
                                   pathlib.Path.home() / ".cache" / "llmfabric-engines"))
VENVS = {"vllm": HOME / "vllm-venv", "llamacpp": HOME / "llamacpp-venv"}


def install(engine: str) -> pathlib.Path:
    """The engine's venv, installed (idempotent, cached); a failed install fails the test."""
    result = subprocess.run([str(ROOT / "scripts" / "install-engines.sh"), engine],
                            capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        pytest.fail(f"installing {engine} failed:\n{result.stderr[-3000:]}")
    return VENVS[engine]


def tiny_model(venv: pathlib.Path, out: pathlib.Path, gguf: bool) -> pathlib.Path:
    args = [str(venv / "bin" / "python"), str(pathlib.Path(__file__).with_name("tinymodel.py")),
            str(out)] + (["--gguf"] if gguf else [])
    subprocess.run(args, check=True, capture_output=True, timeout=300)
    return out / "tiny-f32.gguf" if gguf else out / "hf"
