"""Engine adapters: kind detection, facts from the command and files, served models."""

from __future__ import annotations

import json
import pathlib
import struct

import pytest

from llmfabric.agent.command import parse_engine_command
from llmfabric.agent.engines import KINDS, context_from_command, detect_kind, kind_named
from llmfabric.agent.errors import EngineCommandError
from llmfabric.agent.facts import gguf_file_type, precision_of, served_models

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("argv", "kind", "url"), [
    (["python", "-m", "llama_cpp.server", "--model", "m.gguf", "--port", "9"],
     "llama-cpp-python", "http://127.0.0.1:9"),
    (["python", "-m", "llama_cpp.server", "--model", "m.gguf"], "llama-cpp-python",
     "http://127.0.0.1:8000"),
    (["llama-server", "-m", "m.gguf"], "llama.cpp", "http://127.0.0.1:8080"),
    (["text-generation-launcher", "--model-id", "x"], "tgi", "http://127.0.0.1:3000"),
    (["llmfabric", "engine", "torch", "--model", "x", "--port", "5"], "torch",
     "http://127.0.0.1:5"),
    (["/venv/bin/vllm", "serve", "m"], "vllm", "http://127.0.0.1:8000"),
    (["./my-server", "--port", "7"], "openai", "http://127.0.0.1:7"),
    # behind the container launchers a Slurm profile renders (they read "openai": no vLLM
    # metrics, tokenize or context for the node); an image named after vLLM decides nothing
    (["apptainer", "exec", "--nv", "--bind", "/s:/s", "docker://vllm/vllm-openai:latest",
      "vllm", "serve", "m", "--port", "9"], "vllm", "http://127.0.0.1:9"),
    (["enroot", "start", "--rw", "--mount", "/s:/s", "img", "python", "-m",
      "sglang.launch_server", "--port", "5"], "sglang", "http://127.0.0.1:5"),
    (["srun", "--ntasks=1", "--container-image=x", "--container-mounts=/a:/a", "vllm",
      "serve", "m"], "vllm", "http://127.0.0.1:8000"),
    (["apptainer", "exec", "/images/vllm.sif", "python", "-m", "sglang.launch_server",
      "--port", "3"], "sglang", "http://127.0.0.1:3"),
    # llmfabric's own engines behind a launcher (past the command's first five words)
    (["apptainer", "exec", "--nv", "img.sif", "llmfabric", "engine", "sim", "--port", "7"],
     "sim", "http://127.0.0.1:7"),
    (["docker", "run", "--rm", "img", "python", "-m", "llmfabric.cli.engine", "torch",
      "--port", "8"], "torch", "http://127.0.0.1:8"),
    # an option's value names no engine: the engine's own command decides, in order
    (["apptainer", "exec", "x.sif", "python", "-m", "sglang.launch_server",
      "--served-model-name", "my-vllm", "--port", "4"], "sglang", "http://127.0.0.1:4"),
    (["apptainer", "exec", "--nv", "x.sif", "python3", "-m", "sglang.launch_server",
      "--model-path", "/models/vllm-tuned"], "sglang", "http://127.0.0.1:30000"),
    (["docker", "run", "--gpus", "all", "img", "llama-server", "-m", "vllm.gguf",
      "--port", "6"], "llama.cpp", "http://127.0.0.1:6"),
    (["python", "-m", "sglang.launch_server", "--served-model-name", "my-vllm"], "sglang",
     "http://127.0.0.1:30000"),
    # a launcher option's value names no engine, whatever it holds
    (["apptainer", "exec", "--bind", "/opt/vllm", "x.sif", "python", "-m",
      "sglang.launch_server"], "sglang", "http://127.0.0.1:30000"),
    (["docker", "run", "--name", "vllm-box", "-v", "/vllm:/c", "img", "llama-server", "-m",
      "m.gguf"], "llama.cpp", "http://127.0.0.1:8080"),
    (["srun", "-J", "vllm", "--container-image=img", "python", "-m",
      "sglang.launch_server"], "sglang", "http://127.0.0.1:30000"),
    # a suffix-less image named after an engine decides nothing when a command follows ...
    (["apptainer", "exec", "--nv", "vllm-latest", "python", "-m", "sglang.launch_server"],
     "sglang", "http://127.0.0.1:30000"),
    (["singularity", "exec", "--nv", "vllm", "./server", "--port", "3"], "openai",
     "http://127.0.0.1:3"),
    # ... and decides when the image's own entrypoint runs the engine: at once when only
    # options follow, after the command's words otherwise (a positional model)
    (["docker", "run", "--gpus", "all", "vllm/vllm-openai:latest", "--model", "m"], "vllm",
     "http://127.0.0.1:8000"),
    (["docker", "run", "--gpus", "all", "-p", "8000:8000", "vllm/vllm-openai:latest",
      "Qwen/Qwen2.5-7B-Instruct"], "vllm", "http://127.0.0.1:8000"),
    (["singularity", "run", "--nv", "vllm.sif", "--port", "3"], "vllm", "http://127.0.0.1:3"),
    (["docker", "run", "vllm-base", "python3", "-m", "sglang.launch_server"], "sglang",
     "http://127.0.0.1:30000"),
    # --entrypoint heads the command; options' values are skipped, whatever the option
    (["podman", "run", "--entrypoint=python3", "vllm-base:latest", "-m",
      "sglang.launch_server", "--port", "5"], "sglang", "http://127.0.0.1:5"),
    (["docker", "run", "--entrypoint", "llama-server", "vllm-base", "-m", "m.gguf"],
     "llama.cpp", "http://127.0.0.1:8080"),
    (["docker", "run", "--userns", "host", "--gpus", "all", "img-x", "python3", "-m",
      "sglang.launch_server"], "sglang", "http://127.0.0.1:30000"),
    (["podman", "run", "docker://lmsysorg/sglang:latest"], "sglang", "http://127.0.0.1:30000"),
    # launchers nest
    (["srun", "--ntasks", "1", "apptainer", "exec", "-B", "/vllm", "x.sif", "llama-server"],
     "llama.cpp", "http://127.0.0.1:8080"),
])
def test_detected_kind_and_url(argv: list[str], kind: str, url: str) -> None:
    cmd = parse_engine_command(argv)
    assert (cmd.kind, cmd.base_url) == (kind, url)


def test_engine_flag_overrides_detection() -> None:
    cmd = parse_engine_command(["./serve.sh", "--port", "1234"], kind="vllm")
    assert cmd.kind == "vllm" and cmd.adapter.metrics_format == "vllm"
    assert kind_named("llamacpp") is KINDS["llama.cpp"]
    assert kind_named("TGI") is KINDS["tgi"]
    with pytest.raises(EngineCommandError, match="unknown engine kind 'nope'"):
        parse_engine_command(["x", "--port", "1"], kind="nope")
    # torch engines, like sim ones, must name their port
    with pytest.raises(EngineCommandError, match="--port"):
        parse_engine_command(["llmfabric", "engine", "torch", "--model", "m"])


@pytest.mark.parametrize(("argv", "ctx"), [
    (["vllm", "serve", "m", "--max-model-len", "8192"], 8192),
    (["vllm", "serve", "m", "--max-model-len=4096"], 4096),
    (["python", "-m", "llama_cpp.server", "--model", "m", "--n_ctx", "1024"], 1024),
    (["llama-server", "-m", "m", "-c", "512"], 512),
    (["llama-server", "-m", "m", "--ctx-size", "2048"], 2048),
    (["python", "-m", "sglang.launch_server", "--context-length", "32768"], 32768),
    (["text-generation-launcher", "--max-total-tokens", "3000"], 3000),
    (["vllm", "serve", "m", "--max-model-len", "lots"], None),
    (["vllm", "serve", "m"], None),
])
def test_context_from_command(argv: list[str], ctx: int | None) -> None:
    assert context_from_command(detect_kind(argv), argv) == ctx


def _gguf(path: pathlib.Path, ftype: int, extra_first: bool = True) -> pathlib.Path:
    def kv_str(key: str, value: str) -> bytes:
        return (struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", 8)
                + struct.pack("<Q", len(value)) + value.encode())

    def kv_u32(key: str, value: int) -> bytes:
        return struct.pack("<Q", len(key)) + key.encode() + struct.pack("<II", 4, value)

    def kv_arr(key: str, items: list[int]) -> bytes:
        return (struct.pack("<Q", len(key)) + key.encode() + struct.pack("<II", 9, 5)
                + struct.pack("<Q", len(items)) + b"".join(struct.pack("<i", i) for i in items))

    kvs = [kv_str("general.architecture", "llama"), kv_arr("tokenizer.ggml.token_type", [1, 3]),
           kv_u32("general.file_type", ftype)]
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs))
    return path


def test_precision_from_flags_gguf_and_config(tmp_path: pathlib.Path) -> None:
    assert precision_of(["vllm", "serve", "m", "--dtype", "float32"]) == ("fp32", 32)
    assert precision_of(["vllm", "serve", "m", "--dtype", "half"]) == ("fp16", 16)
    assert precision_of(["vllm", "serve", "m", "--dtype=bfloat16"]) == ("bf16", 16)
    assert precision_of(["vllm", "serve", "m", "-q", "awq", "--dtype", "half"]) == (
        "awq-int4", 4)
    f32 = _gguf(tmp_path / "a.gguf", 0)
    q4 = _gguf(tmp_path / "b.gguf", 15)
    assert gguf_file_type(f32) == 0
    assert precision_of(["python", "-m", "llama_cpp.server", "--model", str(f32)]) == (
        "fp32", 32)
    assert precision_of(["llama-server", "-m", str(q4)]) == ("gguf-q4_k_m", 4)
    bad = tmp_path / "c.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 7)  # truncated header
    assert gguf_file_type(bad) is None
    assert precision_of(["llama-server", "-m", str(bad)]) == ("gguf", 4)
    model_dir = tmp_path / "hf"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"torch_dtype": "float16"}))
    assert precision_of(["vllm", "serve", str(model_dir)]) == ("fp16", 16)
    assert precision_of(["vllm", "serve", "org/remote-model"]) == ("auto", 16)


def test_served_models_context_sources_and_declared_ids() -> None:
    vllm = ["vllm", "serve", "m", "--max-model-len", "1024"]
    # /v1/models max_model_len wins over the command
    got = served_models([{"id": "m", "max_model_len": 2048}], vllm, 4096, detect_kind(vllm))
    assert [(m.id, m.max_context) for m in got] == [("m", 2048)]
    lcpp = ["python", "-m", "llama_cpp.server", "--model", "x.gguf", "--n_ctx", "1024"]
    got = served_models([{"id": "x.gguf"}], lcpp, 4096, detect_kind(lcpp))
    assert got[0].max_context == 1024  # not the node's 4096 default
    bare = ["python", "-m", "llama_cpp.server", "--model", "x.gguf"]
    assert served_models([{"id": "x"}], bare, 4096, detect_kind(bare))[0].max_context == 2048
    srv = ["llama-server", "-m", "x.gguf"]
    assert served_models([{"id": "x"}], srv, 4096, detect_kind(srv), probed_ctx=777)[
        0].max_context == 777
    # --model-id: the engine lists nothing (transformers serve) or other names
    declared = served_models([], ["./srv", "--port", "1"], 4096, detect_kind(["./srv"]),
                             model_ids=("a", "b"))
    assert [m.id for m in declared] == ["a", "b"]
