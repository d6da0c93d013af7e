"""Model configuration of the reference engine: presets and Hugging Face config.json files,
plus a byte-level tokenizer of our own (nothing is downloaded)."""

from __future__ import annotations

import codecs
import json
import pathlib
from dataclasses import dataclass, replace

BOS, EOS = 256, 257
VOCAB = 260  # 256 bytes, BOS, EOS and two reserved ids


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A Llama-architecture model (RMSNorm, RoPE, GQA, SwiGLU)."""

    name: str = "tiny-llama"
    vocab_size: int = VOCAB
    hidden: int = 128
    layers: int = 4
    heads: int = 8
    kv_heads: int = 4
    intermediate: int = 344
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    max_model_len: int = 2048
    seed: int = 0
    checkpoint: str = ""  # a file from train.py (torch.save of named tensors); "": seeded

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def params(self) -> int:
        h, kv, f = self.hidden, self.kv_dim, self.intermediate
        per_layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h
        return self.layers * per_layer + 2 * self.vocab_size * h + h

    def check_width(self, width: int) -> None:
        """Tensor parallelism at `width` shards heads, KV heads and the MLP evenly."""
        if self.heads % width or self.kv_heads % width or self.intermediate % width:
            raise ValueError(f"{self.name}: width {width} must divide heads ({self.heads}), "
                             f"kv_heads ({self.kv_heads}) and intermediate "
                             f"({self.intermediate})")


PRESETS: dict[str, ModelConfig] = {
    # ~0.9M parameters: fast enough for tests on two shared cores, widths up to 4
    "tiny-llama": ModelConfig(),
    # ~0.2M parameters, for the quickest tests
    "micro-llama": ModelConfig(name="micro-llama", hidden=64, layers=2, heads=4, kv_heads=2,
                               intermediate=172),
    # ~7M parameters, for tokens/s that are not dominated by per-step overhead
    "small-llama": ModelConfig(name="small-llama", hidden=256, layers=8, heads=8, kv_heads=4,
                               intermediate=688),
}


def from_hf_config(path: str | pathlib.Path, name: str | None = None) -> ModelConfig:
    """Read a Hugging Face LlamaConfig-style config.json (weights stay seeded; the
    vocabulary is ours: byte-level)."""
    p = pathlib.Path(path)
    raw = json.loads(p.read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"{p}: not a JSON object")
    try:
        heads = int(raw["num_attention_heads"])
        cfg = ModelConfig(
            name=name or str(raw.get("_name_or_path") or p.parent.name or "hf-llama"),
            hidden=int(raw["hidden_size"]),
            layers=int(raw["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(raw.get("num_key_value_heads", heads)),
            intermediate=int(raw["intermediate_size"]),
            rope_theta=float(raw.get("rope_theta", 10000.0)),
            norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
            max_model_len=int(raw.get("max_position_embeddings", 2048)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{p}: not a Llama config ({exc})") from exc
    if cfg.hidden % cfg.heads or cfg.heads % cfg.kv_heads or min(
            cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.intermediate) < 1:
        raise ValueError(f"{p}: inconsistent sizes")
    return cfg


def load_config(spec: str, seed: int | None = None) -> ModelConfig:
    """A preset name or a path to a config.json."""
    cfg = PRESETS.get(spec)
    if cfg is None:
        if not pathlib.Path(spec).is_file():
            raise ValueError(f"unknown model config {spec!r}: a preset "
                             f"({', '.join(PRESETS)}) or a config.json path")
        cfg = from_hf_config(spec)
    return cfg if seed is None else replace(cfg, seed=seed)


class ByteTokenizer:
    """UTF-8 bytes are tokens 0-255; BOS starts every prompt; EOS ends a generation."""

    bos = BOS
    eos = EOS

    def encode(self, text: str, bos: bool = True) -> list[int]:
        return ([BOS] if bos else []) + list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def chat_prompt(self, messages: list[tuple[str, str]]) -> list[int]:
        text = "".join(f"<{role}>{content}\n" for role, content in messages) + "<assistant>"
        return self.encode(text)


class StreamDecoder:
    """Turns generated ids into text pieces without splitting a UTF-8 character."""

    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def piece(self, token: int) -> str:
        return self._dec.decode(bytes([token])) if token < 256 else ""

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)
