"""Train a tiny checkpoint on CPU in seconds, so the layout tests also run on weights that
mean something (peaked logits, a text the model has learned) and not only seeded noise.

The training forward is the engine's own maths (rms_norm, RoPE, causal GQA attention,
SwiGLU from model.py) over whole sequences, without the KV pool, so a trained model
continues its training text under the engine at any width. Adam on next-byte prediction.

    python -m llmfabric.engines.torchref.train --out m.pt     # tiny-llama: ~2 s, 1 thread
    llmfabric engine torch --config tiny-llama --checkpoint m.pt --port P
"""

from __future__ import annotations

import argparse
import pathlib
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from llmfabric.engines.torchref.config import ByteTokenizer, ModelConfig, load_config
from llmfabric.engines.torchref.model import _attention, apply_rope, rms_norm, rope_tables
from llmfabric.engines.torchref.weights import (
    Weights,
    assemble_weights,
    init_weights,
    weights_from_state,
    weights_to_state,
)

# a short text of our own that the model memorises (bytes are the tokens)
DEFAULT_TEXT = ("Flying Serving binds data parallel engines into tensor parallel groups and "
                "releases them again, without moving weights or key value caches. ")


@dataclass(frozen=True, slots=True)
class TrainResult:
    weights: Weights
    first_loss: float
    final_loss: float
    steps: int


def sequence_logits(cfg: ModelConfig, weights: Weights, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [T, vocab] for one whole sequence at width 1 (differentiable)."""
    n, hd = tokens.shape[0], cfg.head_dim
    cos, sin = rope_tables(torch.arange(n), hd, cfg.rope_theta)
    x = weights.embed[tokens]
    for lw in weights.layers:
        h = rms_norm(x, lw.attn_norm, cfg.norm_eps)
        q = apply_rope(F.linear(h, lw.wq).view(n, lw.heads, hd), cos, sin)
        k = apply_rope(F.linear(h, lw.wk).view(n, lw.kv_heads, hd), cos, sin)
        v = F.linear(h, lw.wv).view(n, lw.kv_heads, hd)
        x = x + F.linear(_attention(q, k, v, 0).reshape(n, -1), lw.wo)
        h = rms_norm(x, lw.mlp_norm, cfg.norm_eps)
        x = x + F.linear(F.silu(F.linear(h, lw.w_gate)) * F.linear(h, lw.w_up), lw.w_down)
    return F.linear(rms_norm(x, weights.norm, cfg.norm_eps), weights.lm_head)


def train(cfg: ModelConfig, text: str = DEFAULT_TEXT, steps: int = 300, lr: float = 3e-3,
          target_loss: float = 0.02, threads: int = 1) -> TrainResult:
    """Adam from the seeded weights on `text` (BOS + bytes, repeated to fill a window);
    stops early once the mean next-byte loss is under `target_loss`. One torch thread by
    default: these matrices are too small to gain from more, and a busy machine loses."""
    if steps < 1 or not text:
        raise ValueError("need steps >= 1 and a non-empty text")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _train(cfg, text, steps, lr, target_loss)
    finally:
        torch.set_num_threads(before)


def _train(cfg: ModelConfig, text: str, steps: int, lr: float, target_loss: float
           ) -> TrainResult:
    torch.manual_seed(cfg.seed)
    ids = ByteTokenizer().encode(text * 2)[: min(cfg.max_model_len, 256)]
    tokens = torch.tensor(ids, dtype=torch.long)
    state = {k: v.clone().requires_grad_(True)
             for k, v in weights_to_state(init_weights(replace(cfg, checkpoint=""))).items()}
    opt = torch.optim.Adam(state.values(), lr=lr)
    first = final = float("nan")
    done = 0
    for done in range(1, steps + 1):
        logits = sequence_logits(cfg, assemble_weights(cfg, state), tokens[:-1])
        loss = F.cross_entropy(logits, tokens[1:])
        grads = torch.autograd.grad(loss, list(state.values()))
        for param, grad in zip(state.values(), grads, strict=True):
            param.grad = grad
        opt.step()
        final = float(loss.detach())
        first = final if done == 1 else first
        if final < target_loss:
            break
    trained = {k: v.detach().clone() for k, v in state.items()}
    return TrainResult(weights_from_state(cfg, trained), first, final, done)


def save_checkpoint(weights: Weights, path: str | pathlib.Path) -> None:
    torch.save(weights_to_state(weights), str(path))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--config", default="tiny-llama", help="preset or config.json")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--text", type=pathlib.Path, default=None, help="UTF-8 training text")
    ap.add_argument("--out", type=pathlib.Path, required=True)
    args = ap.parse_args(argv)
    text = args.text.read_text("utf-8") if args.text else DEFAULT_TEXT
    res = train(load_config(args.config), text, args.steps)
    save_checkpoint(res.weights, args.out)
    print(f"{args.out}: loss {res.first_loss:.3f} -> {res.final_loss:.4f} in {res.steps} steps")


if __name__ == "__main__":
    main()
