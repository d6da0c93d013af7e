"""Engine facts from the engine or its command line, never a default that lies.

- precision: `--quantization/-q` (awq, gptq, fp8, ...); else `--dtype` (float32 -> fp32,
  float16/half -> fp16, bfloat16 -> bf16); else a GGUF model file's own type (read from its
  header: F32, F16, Q8_0, Q4_K_M, ...); else a local model directory's config.json
  `torch_dtype`/`dtype`; else "auto" (the engine picks from the model; we do not know).
- context: /v1/models `max_model_len` (vLLM, sim, torch), the command's context flag
  (`--max-model-len`, `--context-length`, `-c`, `--n_ctx`, `--max-total-tokens`), llama-server's
  /props, the engine's documented default (llama-cpp-python: 2048), else the node's default.
  `engine_context` asks a running engine alone (no command line: the standalone ingress).
- model ids: /v1/models, or `--model-id` (repeatable) for engines that list none.
- prefill/decode role (ThunderServe): the /v1/models entry's `role` (the sim engine), else
  vLLM's `--kv-transfer-config` `kv_role` (kv_producer -> prefill, kv_consumer -> decode,
  kv_both -> both), else both; anything else is ignored (both), never trusted as text.
"""

from __future__ import annotations

import json
import pathlib
import struct
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO

from llmfabric.agent.engines import EngineKind, context_from_command, flag_value
from llmfabric.agent.probe import EngineProbe
from llmfabric.registry.codec import MAX_ITEMS, MAX_STR
from llmfabric.registry.records import ModelRole, ServedModel
from llmfabric.untrusted import get_logger

log = get_logger(__name__)
MAX_CONTEXT = 1 << 40  # tokens: a larger max_model_len is garbage (2**64 could not be signed)

_QUANT: dict[str, tuple[str, int]] = {
    "awq": ("awq-int4", 4), "awq_marlin": ("awq-int4", 4), "gptq": ("gptq-int4", 4),
    "gptq_marlin": ("gptq-int4", 4), "fp8": ("fp8", 8), "int8": ("int8", 8),
    "w8a8": ("int8", 8), "bitsandbytes": ("bnb-int4", 4), "gguf": ("gguf", 4),
    "int4": ("int4", 4),
}
_DTYPES: dict[str, tuple[str, int]] = {
    "float32": ("fp32", 32), "fp32": ("fp32", 32), "f32": ("fp32", 32), "float": ("fp32", 32),
    "float16": ("fp16", 16), "fp16": ("fp16", 16), "half": ("fp16", 16), "f16": ("fp16", 16),
    "bfloat16": ("bf16", 16), "bf16": ("bf16", 16),
}
# GGUF `general.file_type` (llama.cpp's llama_ftype) -> (name, bits per weight, rounded).
_GGUF_FTYPES: dict[int, tuple[str, int]] = {
    0: ("fp32", 32), 1: ("fp16", 16), 2: ("gguf-q4_0", 4), 3: ("gguf-q4_1", 4),
    7: ("gguf-q8_0", 8), 8: ("gguf-q5_0", 5), 9: ("gguf-q5_1", 5), 10: ("gguf-q2_k", 2),
    11: ("gguf-q3_k_s", 3), 12: ("gguf-q3_k_m", 3), 13: ("gguf-q3_k_l", 3),
    14: ("gguf-q4_k_s", 4), 15: ("gguf-q4_k_m", 4), 16: ("gguf-q5_k_s", 5),
    17: ("gguf-q5_k_m", 5), 18: ("gguf-q6_k", 6), 32: ("bf16", 16),
}
AUTO = ("auto", 16)


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise ValueError("truncated GGUF header")
    return data


def _gguf_skip_value(f: BinaryIO, vtype: int) -> Any:
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    if vtype in sizes:
        raw = _read(f, sizes[vtype])
        fmt = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
               10: "<Q", 11: "<q", 12: "<d"}[vtype]
        return struct.unpack(fmt, raw)[0]
    if vtype == 8:  # string
        (n,) = struct.unpack("<Q", _read(f, 8))
        if n > 1 << 26:
            raise ValueError("GGUF string too long")
        return _read(f, n)
    if vtype == 9:  # array
        (etype,) = struct.unpack("<I", _read(f, 4))
        (count,) = struct.unpack("<Q", _read(f, 8))
        if count > 1 << 24:
            raise ValueError("GGUF array too long")
        for _ in range(count):
            _gguf_skip_value(f, etype)
        return None
    raise ValueError(f"unknown GGUF value type {vtype}")


def gguf_file_type(path: pathlib.Path) -> int | None:
    """`general.file_type` from a GGUF file's header (None when absent or not GGUF)."""
    try:
        with path.open("rb") as f:
            if _read(f, 4) != b"GGUF":
                return None
            (version,) = struct.unpack("<I", _read(f, 4))
            if version < 2:
                return None
            _tensors, kv_count = struct.unpack("<QQ", _read(f, 16))
            for _ in range(min(kv_count, 100_000)):
                (klen,) = struct.unpack("<Q", _read(f, 8))
                key = _read(f, min(klen, 1 << 16)).decode(errors="replace")
                (vtype,) = struct.unpack("<I", _read(f, 4))
                value = _gguf_skip_value(f, vtype)
                if key == "general.file_type" and isinstance(value, int):
                    return value
    except (OSError, ValueError, struct.error):
        return None
    return None


def _model_arg(argv: Sequence[str]) -> str | None:
    """The model path/name in the command (`-m`, `--model`, `--model-path`, `vllm serve M`)."""
    for arg in argv:
        if arg.lower().endswith(".gguf"):
            return arg
    value = flag_value(argv, "--model", "--model-path", "-m")  # (`python -m X` comes first)
    if value is not None:
        return value
    for i, arg in enumerate(argv[:-1]):
        if arg == "serve" and not argv[i + 1].startswith("-"):
            return argv[i + 1]
    return None


def precision_of(argv: Sequence[str]) -> tuple[str, int]:
    """(quantization, bits) of what the engine runs (see the module docstring)."""
    value = flag_value(argv, "--quantization", "-q")
    if value and value.lower() in _QUANT:
        return _QUANT[value.lower()]
    dtype = flag_value(argv, "--dtype")
    if dtype and dtype.lower() in _DTYPES:
        return _DTYPES[dtype.lower()]
    model = _model_arg(argv)
    if model:
        path = pathlib.Path(model).expanduser()
        if path.suffix.lower() == ".gguf":
            ftype = gguf_file_type(path)
            if ftype is not None and ftype in _GGUF_FTYPES:
                return _GGUF_FTYPES[ftype]
            return ("gguf", 4) if ftype is None else (f"gguf-ftype{ftype}", 4)
        config = path / "config.json"
        try:
            doc = json.loads(config.read_text())
        except (OSError, ValueError):
            doc = None
        if isinstance(doc, dict):
            dt = doc.get("torch_dtype") or doc.get("dtype")
            if isinstance(dt, str) and dt.lower() in _DTYPES:
                return _DTYPES[dt.lower()]
    return AUTO


_KV_ROLES = {"kv_producer": ModelRole.PREFILL, "kv_consumer": ModelRole.DECODE,
             "kv_both": ModelRole.BOTH}


def role_of(entry: dict[str, Any], argv: Sequence[str]) -> ModelRole:
    """The prefill/decode role an engine serves a model in (see the module docstring)."""
    got = entry.get("role")
    if isinstance(got, str) and got in {r.value for r in ModelRole}:
        return ModelRole(got)
    config = flag_value(argv, "--kv-transfer-config")
    if config:
        try:
            doc = json.loads(config)
        except ValueError:
            doc = None
        kv_role = doc.get("kv_role") if isinstance(doc, dict) else None
        if isinstance(kv_role, str) and kv_role in _KV_ROLES:
            return _KV_ROLES[kv_role]
    return ModelRole.BOTH


def served_models(data: list[dict[str, Any]], argv: Sequence[str], default_ctx: int,
                  kind: EngineKind | None = None, probed_ctx: int | None = None,
                  model_ids: Sequence[str] = ()) -> tuple[ServedModel, ...]:
    """ServedModels from /v1/models entries (or the declared `model_ids`), with precision
    and context from the engine or the command."""
    quant, bits = precision_of(argv)
    if (quant, bits) == AUTO and kind is not None and kind.default_precision is not None:
        quant, bits = kind.default_precision
    cmd_ctx = context_from_command(kind, argv) if kind is not None else None
    fallback = cmd_ctx or probed_ctx or (kind.default_context if kind else None) or default_ctx
    listed = {str(d["id"]): d for d in data if isinstance(d.get("id"), str)}
    # vLLM lists each loaded LoRA adapter (--lora-modules) as an entry whose `parent` is
    # the base model: advertised as that model's adapters, not as models of their own.
    adapters: dict[str, list[str]] = {}
    for mid, d in listed.items():
        parent = d.get("parent")
        if isinstance(parent, str) and parent in listed and parent != mid:
            adapters.setdefault(parent, []).append(mid)
    lora = {a for names in adapters.values() for a in names}
    ids = list(model_ids) or [mid for mid in listed if mid not in lora]
    out = []
    for mid in _fitting(ids, "model ids"):
        out.append(ServedModel(
            id=mid, quantization=quant, quant_bits=bits,
            max_context=listed_context(listed.get(mid, {})) or fallback,
            adapters=_fitting(adapters.get(mid, ()), f"LoRA adapters of {mid}"),
            role=role_of(listed.get(mid, {}), argv),
        ))
    return tuple(out)


def listed_context(entry: Mapping[str, Any]) -> int | None:
    """A /v1/models entry's `max_model_len` (vLLM, SGLang, sim, torch) if it is a sane one."""
    n = entry.get("max_model_len")
    return n if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= MAX_CONTEXT \
        else None


def props_context(body: Any) -> int | None:
    """llama-server's running context from its /props answer
    (`default_generation_settings.n_ctx`, older servers: `n_ctx`)."""
    settings = body.get("default_generation_settings") if isinstance(body, dict) else None
    n = settings.get("n_ctx") if isinstance(settings, dict) else None
    if n is None and isinstance(body, dict):
        n = body.get("n_ctx")
    return n if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= MAX_CONTEXT \
        else None


async def engine_context(probe: EngineProbe, base_url: str, model: str,
                         timeout_s: float) -> int | None:
    """The context a running engine serves `model` with, from the engine alone: its
    /v1/models entry for `model` (or its only entry, listed under another name)'s
    `max_model_len`, else llama-server's /props. None: the engine answered without saying;
    raises ProbeError when /v1/models does not answer (down, or not an OpenAI server)."""
    data = await probe.models(base_url, timeout_s)
    entry = next((d for d in data if d["id"] == model), data[0] if len(data) == 1 else None)
    listed = listed_context(entry) if entry is not None else None
    if listed is not None:
        return listed
    return props_context(await probe.get_json(base_url, "/props", timeout_s))


def _fitting(names: Sequence[str], what: str) -> tuple[str, ...]:
    """The names a record can carry (every replica refuses longer names or longer lists:
    an engine listing them made the node sign a record nobody took, or fail to sign one),
    the rest left out with a log line."""
    fit = [n for n in names if len(n) <= MAX_STR][:MAX_ITEMS]
    if len(fit) < len(names):
        log.error("the engine lists %d %s; %d fit in the node's record (names of at most "
                  "%d characters, %d per list): the rest are not advertised", len(names),
                  what, len(fit), MAX_STR, MAX_ITEMS)
    return tuple(fit)
