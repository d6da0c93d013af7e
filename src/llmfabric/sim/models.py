"""Model specs: built-in presets and Hugging Face `config.json` parsing.

A ModelSpec holds what the cost model needs: layer count, hidden size, attention heads (GQA via
`n_kv_heads`), explicit `head_dim`, MLP width and kind (gated SwiGLU or plain two-matrix),
Mixture-of-Experts (`n_experts`, `experts_per_token`), vocabulary, tied embeddings, and the
quantization of weights and KV cache in bits.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from llmfabric.sim.errors import SpecError, UnknownModelError


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_hidden: int
    vocab: int
    gated_mlp: bool = True
    tied_embeddings: bool = False
    n_experts: int = 1
    experts_per_token: int = 1
    weight_bits: int = 16
    kv_bits: int = 16
    act_bits: int = 16
    max_context: int = 4096
    aliases: tuple[str, ...] = ()
    # operand precision of the linear layers' GEMMs (W8A8 FP8: 8, NVFP4 W4A4: 4); 0 = derived:
    # 8-bit weights run at the FP8/INT8 peak, narrower weights are dequantized to act_bits
    gemm_bits: int = 0

    def __post_init__(self) -> None:
        for field in ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "ffn_hidden",
                      "vocab", "n_experts", "experts_per_token", "max_context"):
            if getattr(self, field) <= 0:
                raise SpecError(f"model {self.name!r}: {field} must be positive")
        if self.n_heads % self.n_kv_heads:
            raise SpecError(f"model {self.name!r}: n_heads must be a multiple of n_kv_heads")
        if self.experts_per_token > self.n_experts:
            raise SpecError(f"model {self.name!r}: experts_per_token > n_experts")
        for field in ("weight_bits", "kv_bits", "act_bits"):
            if getattr(self, field) not in (4, 8, 16, 32):
                raise SpecError(f"model {self.name!r}: {field} must be 4, 8, 16 or 32")
        if self.gemm_bits not in (0, 4, 8, 16, 32):
            raise SpecError(f"model {self.name!r}: gemm_bits must be 0 (derived), 4, 8, 16 or 32")

    @property
    def matmul_bits(self) -> int:
        """Operand bits of the linear GEMMs (selects the tensor-core peak)."""
        if self.gemm_bits:
            return self.gemm_bits
        return min(self.weight_bits, self.act_bits) if self.weight_bits >= 8 else self.act_bits

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2

    def attn_params_per_layer(self) -> int:
        return self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden

    def expert_params(self) -> int:
        return self.mlp_matrices * self.hidden * self.ffn_hidden

    def mlp_params_per_layer(self) -> int:
        router = self.hidden * self.n_experts if self.n_experts > 1 else 0
        return self.n_experts * self.expert_params() + router

    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def total_params(self) -> int:
        per_layer = self.attn_params_per_layer() + self.mlp_params_per_layer() + 2 * self.hidden
        return self.n_layers * per_layer + self.embedding_params() + self.hidden

    def active_params(self) -> int:
        """Parameters touched per token (MoE: only `experts_per_token` experts)."""
        mlp = self.experts_per_token * self.expert_params()
        per_layer = self.attn_params_per_layer() + mlp + 2 * self.hidden
        return self.n_layers * per_layer + self.embedding_params() + self.hidden

    def kv_bytes_per_token(self) -> float:
        """KV cache bytes per token over all layers (whole model, before TP sharding)."""
        return 2 * self.n_layers * self.kv_dim * self.kv_bits / 8

    def with_quantization(self, weight_bits: int | None = None,
                          kv_bits: int | None = None,
                          gemm_bits: int | None = None) -> ModelSpec:
        """Weight/KV bytes (`weight_bits`, `kv_bits`) and, with `gemm_bits`, the GEMM operand
        precision: `with_quantization(8, 8)` is FP8 weights and KV (W8A8: FP8 peak);
        `with_quantization(4, 8, gemm_bits=4)` is NVFP4 (W4A4 at the FP4 peak)."""
        return dataclasses.replace(
            self,
            weight_bits=self.weight_bits if weight_bits is None else weight_bits,
            kv_bits=self.kv_bits if kv_bits is None else kv_bits,
            gemm_bits=self.gemm_bits if gemm_bits is None else gemm_bits,
        )


def _m(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int,
       *aliases: str, head_dim: int | None = None, ctx: int = 4096, **kw: Any) -> ModelSpec:
    return ModelSpec(name=name, n_layers=layers, hidden=hidden, n_heads=heads, n_kv_heads=kv,
                     head_dim=head_dim or hidden // heads, ffn_hidden=ffn, vocab=vocab,
                     max_context=ctx, aliases=aliases, **kw)


# Values from each model's Hugging Face config.json (see docs/simulator.md).
BUILTIN_MODELS: tuple[ModelSpec, ...] = (
    _m("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, "meta-llama/Llama-2-7b-hf",
       "llama2-7b", "llama-2-7b-chat"),
    _m("llama-2-13b", 40, 5120, 40, 40, 13824, 32000, "meta-llama/Llama-2-13b-hf", "llama2-13b"),
    _m("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, "meta-llama/Llama-2-70b-hf", "llama2-70b"),
    _m("codellama-34b", 48, 8192, 64, 8, 22016, 32000, "codellama/CodeLlama-34b-hf",
       "codellama/CodeLlama-34b-Instruct-hf", ctx=16384),
    _m("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, "meta-llama/Llama-3.1-8B",
       "meta-llama/Meta-Llama-3-8B", "meta-llama/Llama-3.1-8B-Instruct", "llama-3-8b",
       "llama3-8b", "llama-3.1-8b-instruct", "llama3.1-8b", ctx=131072),
    _m("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256, "meta-llama/Llama-3.1-70B",
       "meta-llama/Meta-Llama-3-70B", "llama-3-70b", "llama3-70b", "llama-3.3-70b",
       "llama-3.1-70b-instruct", "llama3.1-70b", ctx=131072),
    _m("qwen3-1.7b", 28, 2048, 16, 8, 6144, 151936, "Qwen/Qwen3-1.7B",
       head_dim=128, tied_embeddings=True, ctx=40960),
    _m("qwen3-32b", 64, 5120, 64, 8, 25600, 151936, "Qwen/Qwen3-32B", head_dim=128, ctx=40960),
    _m("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, "mistralai/Mixtral-8x7B-v0.1",
       "mistralai/Mixtral-8x7B-Instruct-v0.1", n_experts=8, experts_per_token=2, ctx=32768),
    _m("opt-66b", 64, 9216, 72, 72, 36864, 50272, "facebook/opt-66b",
       gated_mlp=False, tied_embeddings=True, ctx=2048),
    _m("opt-175b", 96, 12288, 96, 96, 49152, 50272, "facebook/opt-175b",
       gated_mlp=False, tied_embeddings=True, ctx=2048),
    _m("llama-30b", 60, 6656, 52, 52, 17920, 32000, "huggyllama/llama-30b", "llama-33b",
       "llama1-30b", ctx=2048),
)


def _norm(name: str) -> str:
    key = name.strip().lower()
    key = key.rsplit("/", 1)[-1]
    key = re.sub(r"^meta-", "", key)
    return re.sub(r"[\s_\-.]+", "", key)


# immutable: a model outside the presets is a ModelSpec or a config.json path, passed as such
_BY_KEY: Mapping[str, ModelSpec] = MappingProxyType(
    {_norm(k): spec for spec in BUILTIN_MODELS for k in (spec.name, *spec.aliases)})


def model_names() -> list[str]:
    return sorted({s.name for s in _BY_KEY.values()})


def get_model(name: str | ModelSpec | Path) -> ModelSpec:
    """A preset by name/alias ("llama-3.1-8b", "meta-llama/Llama-2-7b-hf", "Llama3-70B") or
    a path to a Hugging Face config.json (or a directory holding one)."""
    if isinstance(name, ModelSpec):
        return name
    path = Path(name)
    if path.suffix == ".json" or path.is_dir():
        cfg = path / "config.json" if path.is_dir() else path
        if cfg.is_file():
            return model_from_hf_config(cfg)
    key = _norm(str(name))
    if key in _BY_KEY:
        return _BY_KEY[key]
    matches = sorted({s.name for k, s in _BY_KEY.items() if k.startswith(key)})
    if len(matches) == 1:
        return _BY_KEY[_norm(matches[0])]
    hint = f" Did you mean one of {matches}?" if matches else ""
    raise UnknownModelError(
        f"unknown model {str(name)!r}.{hint} Presets: {', '.join(model_names())}; "
        "or pass the path of a Hugging Face config.json."
    )


def _first(cfg: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if key in cfg and cfg[key] is not None:
            return cfg[key]
    return default


def model_from_hf_config(path_or_dict: str | Path | Mapping[str, Any],
                         name: str | None = None) -> ModelSpec:
    """Parse a Hugging Face config.json (Llama/Qwen/Mistral/Mixtral/OPT/GPT-NeoX style)."""
    if isinstance(path_or_dict, Mapping):
        cfg: Mapping[str, Any] = path_or_dict
        default_name = str(cfg.get("_name_or_path", "custom"))
    else:
        try:
            cfg = json.loads(Path(path_or_dict).read_text())
        except (OSError, ValueError) as exc:
            raise SpecError(f"cannot read config {path_or_dict}: {exc}") from exc
        default_name = Path(path_or_dict).parent.name or "custom"
    if "text_config" in cfg and isinstance(cfg["text_config"], Mapping):
        cfg = {**cfg, **cfg["text_config"]}
    try:
        hidden = int(_first(cfg, "hidden_size", "n_embd", "d_model"))
        layers = int(_first(cfg, "num_hidden_layers", "n_layer", "num_layers"))
        heads = int(_first(cfg, "num_attention_heads", "n_head"))
    except TypeError as exc:
        raise SpecError("config.json lacks hidden_size / num_hidden_layers / "
                        "num_attention_heads") from exc
    kv = int(_first(cfg, "num_key_value_heads", "n_kv_heads", default=heads))
    model_type = str(cfg.get("model_type", "")).lower()
    ffn = int(_first(cfg, "intermediate_size", "ffn_dim", "n_inner", "moe_intermediate_size",
                     default=4 * hidden))
    gated = model_type not in ("opt", "gpt2", "gpt_neox", "gptj", "bloom", "falcon", "phi")
    experts = int(_first(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=1))
    if experts > 1 and "moe_intermediate_size" in cfg:
        ffn = int(cfg["moe_intermediate_size"])
    topk = int(_first(cfg, "num_experts_per_tok", "moe_top_k", default=1 if experts == 1 else 2))
    bits = 16
    quant = cfg.get("quantization_config")
    if isinstance(quant, Mapping):
        bits = int(_first(quant, "bits", "w_bit", default=8 if "fp8" in str(quant) else 4))
    dtype = str(cfg.get("torch_dtype", "bfloat16"))
    if dtype == "float32" and quant is None:
        bits = 16  # served in 16-bit regardless of the checkpoint dtype
    return ModelSpec(
        name=name or default_name,
        n_layers=layers,
        hidden=hidden,
        n_heads=heads,
        n_kv_heads=kv,
        head_dim=int(_first(cfg, "head_dim", default=hidden // heads)),
        ffn_hidden=ffn,
        vocab=int(_first(cfg, "vocab_size", default=32000)),
        gated_mlp=gated,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", model_type == "opt")),
        n_experts=experts,
        experts_per_token=topk,
        weight_bits=bits,
        max_context=int(_first(cfg, "max_position_embeddings", "n_positions", default=4096)),
    )
