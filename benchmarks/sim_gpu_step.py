"""Whole serving steps on a GPU against the simulator's step costs, in one run: decode-only
steps (`decode_step_time`) and chunked-prefill steps (`mixed_step_time`).

`sim_gpu_check.py` checks single kernels; this checks what the serving simulator adds them up
to. It builds one GPU's decode step of a dense Llama-style model in torch (BF16, random
weights, TP 1): embedding lookup, per layer RMSNorm, fused QKV GEMM, the new K/V written into
a dense cache, decode attention (`scaled_dot_product_attention` over the cache, GQA), output
projection, residual, RMSNorm, fused gate/up GEMM, SiLU x up, down GEMM, residual; then the
final norm, the LM head and a greedy pick. A mixed step adds one prompt's chunk to the same
GEMMs, with its own causal attention over its cached prefix and the chunk. Rotary embeddings
are left out (an elementwise op on tokens x heads x 128 values, far under 1 % of the step).
The residual add with the next RMSNorm, and SiLU x up, are compiled into one kernel each
(torch.compile), as engines fuse them (`--no-fuse` runs them as plain torch ops).
The step is captured in a CUDA graph, as vLLM runs its decode steps, and graph replays are
timed with CUDA events (median); the same step run eagerly is timed beside it, to show what
kernel launches cost without a graph.

Predicted: `StepCostModel.decode_step_time(batch, batch x context)` (or `mixed_step_time`
with the chunk) minus `step_overhead_s` (the per-iteration scheduler, sampling and
launch-gap time, which a captured graph does not have), so the comparison is GPU time
against GPU time; the full prediction is reported too.

Run: `PYTHONPATH=src python3 benchmarks/sim_gpu_step.py --gpu H100-SXM [--model qwen3-32b]
--json OUT.json` (torch with CUDA; exits with status 2 without it). Memory: Llama-3.1-8B's
weights ~16 GB plus the cache (batch x context <= 262,144 tokens: ~34 GB); Qwen3-32B's
65.6 GB plus <= 32,768 cached tokens (~8.6 GB).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import _clean, markdown_table

from llmfabric.sim.costs import cost_model
from llmfabric.sim.errors import UnknownGPUError
from llmfabric.sim.hardware import get_gpu
from llmfabric.sim.models import ModelSpec, get_model

MODEL = "llama-3.1-8b"  # the default --model
# Per model: (batch, context[, chunk, prefix]) steps, and the most cached tokens (batch x
# context) that fit beside its BF16 weights on an 80 GB GPU. Decode-only steps at the batch
# sizes a single-GPU engine runs, then chunked-prefill steps (one prompt chunk of `chunk`
# tokens after `prefix` cached ones, riding with the decodes; vLLM's default token budget
# is 2048 per step).
STEPS: dict[str, tuple[tuple[tuple[int, ...], ...], int]] = {
    "llama-3.1-8b": ((
        (1, 1024), (8, 1024), (32, 1024), (64, 1024), (128, 1024), (256, 1024),
        (1, 4096), (16, 4096), (64, 4096), (384, 512), (512, 512),
        (64, 1024, 512, 0), (64, 1024, 1984, 0), (256, 1024, 512, 0), (256, 512, 1792, 0),
        (32, 1024, 1024, 3072)), 256 * 1024),
    # 65.6 GB of weights: ~10 GB left for the cache (QK-norm, an elementwise op on q and k,
    # is left out like the rotary embeddings)
    "qwen3-32b": ((
        (1, 1024), (8, 1024), (32, 1024), (16, 2048), (64, 512),
        (8, 1024, 512, 0), (16, 1024, 1024, 0), (8, 1024, 1024, 2048)), 32 * 1024),
}
CASES, MAX_CACHED_TOKENS = STEPS[MODEL]


@dataclass(frozen=True)
class StepCase:
    batch: int
    context: int
    chunk: int = 0  # prompt tokens of one sequence's prefill chunk in the same step
    prefix: int = 0  # that sequence's tokens already cached

    @property
    def label(self) -> str:
        decode = f"b={self.batch} ctx={self.context}"
        return decode + (f" + chunk {self.chunk} after {self.prefix}" if self.chunk else "")


def predicted_s(model: ModelSpec, gpu_name: str, case: StepCase) -> tuple[float, float]:
    """(GPU time, full step time) the simulator predicts for the step: decode-only, or mixed
    (the chunk ends its prompt: one more token sampled)."""
    cm = cost_model(model, get_gpu(gpu_name), 1)
    if case.chunk:
        full = cm.mixed_step_time(case.batch, case.batch * case.context,
                                  [(case.chunk, case.prefix)], 1)
    else:
        full = cm.decode_step_time(case.batch, case.batch * case.context)
    return full - cm.step_overhead_s, full


class Step:
    """One GPU's decode step of `model` (TP 1), its weights and a dense KV cache."""

    def __init__(self, torch: Any, model: ModelSpec, batch: int, context: int,
                 device: str = "cuda", chunk: int = 0, prefix: int = 0,
                 fused: tuple[Callable[..., Any], Callable[..., Any]] | None = None) -> None:
        self.t, self.m, self.batch, self.context = torch, model, batch, context
        self.chunk = chunk
        self.fused = fused or (add_rms_norm, silu_and_mul)
        dev, bf16 = device, torch.bfloat16
        h, d = model.hidden, model.head_dim
        self.q_dim, self.kv_dim = model.n_heads * d, model.n_kv_heads * d

        def weight(rows: int, cols: int) -> Any:
            return torch.randn(rows, cols, device=dev, dtype=bf16) * 0.02

        self.embed = weight(model.vocab, h)
        self.lm_head = self.embed if model.tied_embeddings else weight(model.vocab, h)
        self.layers = [
            (weight(self.q_dim + 2 * self.kv_dim, h), weight(h, self.q_dim),
             weight(2 * model.ffn_hidden, h), weight(h, model.ffn_hidden))
            for _ in range(model.n_layers)
        ]
        shape = (batch, model.n_kv_heads, context, d)
        self.cache = [(torch.randn(shape, device=dev, dtype=bf16),
                       torch.randn(shape, device=dev, dtype=bf16))
                      for _ in range(model.n_layers)]
        self.tokens = torch.randint(0, model.vocab, (batch + chunk,), device=dev)
        self.pos = torch.full((1,), context - 1, device=dev, dtype=torch.long)
        # The prompt's own cache (prefix cached, chunk written this step) and its mask: each
        # chunk token sees the prefix and the chunk tokens up to itself.
        seen = prefix + chunk
        p_shape = (1, model.n_kv_heads, seen, d)
        self.p_cache = [(torch.randn(p_shape, device=dev, dtype=bf16),
                         torch.randn(p_shape, device=dev, dtype=bf16))
                        for _ in range(model.n_layers)] if chunk else []
        self.p_pos = torch.arange(prefix, seen, device=dev)
        # Causal, aligned to the bottom right (chunk token i sees prefix + i + 1 keys): a
        # CausalBias, not a boolean mask, so SDPA can pick a flash kernel for it, as engines
        # use FlashAttention's causal varlen kernel (a materialized mask forced a slower
        # kernel: mixed steps measured up to 23 % over their prediction with it).
        from torch.nn.attention.bias import causal_lower_right

        self.p_bias = causal_lower_right(chunk, seen) if chunk else None

    def __call__(self) -> Any:
        t, m, b, c = self.t, self.m, self.batch, self.chunk
        f, (add_rms, silu_mul) = t.nn.functional, self.fused
        d, kvh = m.head_dim, m.n_kv_heads
        x = self.embed[self.tokens]
        h = rms_norm(t, x)
        for i, (w_qkv, w_o, w_gu, w_down) in enumerate(self.layers):
            qkv = f.linear(h, w_qkv)  # decode rows, then the chunk's rows
            q, k, v = qkv.split((self.q_dim, self.kv_dim, self.kv_dim), dim=-1)
            k_cache, v_cache = self.cache[i]
            k_cache.index_copy_(2, self.pos, k[:b].view(b, kvh, 1, d))
            v_cache.index_copy_(2, self.pos, v[:b].view(b, kvh, 1, d))
            attn = f.scaled_dot_product_attention(
                q[:b].view(b, m.n_heads, 1, d), k_cache, v_cache, enable_gqa=True
            ).reshape(b, self.q_dim)
            if c:
                kp, vp = self.p_cache[i]
                kp.index_copy_(2, self.p_pos, k[b:].view(c, kvh, d).transpose(0, 1)[None])
                vp.index_copy_(2, self.p_pos, v[b:].view(c, kvh, d).transpose(0, 1)[None])
                qp = q[b:].view(c, m.n_heads, d).transpose(0, 1)[None]
                pre = f.scaled_dot_product_attention(qp, kp, vp, attn_mask=self.p_bias,
                                                     enable_gqa=True)
                attn = t.cat((attn, pre[0].transpose(0, 1).reshape(c, self.q_dim)))
            x, h = add_rms(t, x, f.linear(attn, w_o))
            x, h = add_rms(t, x, f.linear(silu_mul(t, f.linear(h, w_gu)), w_down))
        # sampled: every decode, and the chunk's last token (the chunk ends its prompt); h is
        # already the final norm's output
        last = t.cat((h[:b], h[-1:])) if c else h
        return f.linear(last, self.lm_head).argmax(-1)


# The elementwise ops between the GEMMs, each one kernel as engines run them (vLLM's
# fused_add_rms_norm and silu_and_mul) once `fuse()` compiled them: written as several torch
# ops, they make several passes over the activations, which on a 2048-token chunk cost ~7 ms
# of a step that engines do not spend.
def rms_norm(t: Any, x: Any) -> Any:
    return x * t.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype)


def add_rms_norm(t: Any, x: Any, y: Any) -> tuple[Any, Any]:
    """(x + y, rms_norm(x + y)): the residual add and the next layer norm."""
    s = x + y
    return s, rms_norm(t, s)


def silu_and_mul(t: Any, gate_up: Any) -> Any:
    gate, up = gate_up.chunk(2, dim=-1)
    return t.nn.functional.silu(gate) * up


def fuse(torch: Any) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """`add_rms_norm` and `silu_and_mul` compiled by torch.compile (one kernel each, any
    number of tokens: compiled once)."""
    return (torch.compile(add_rms_norm, dynamic=True),
            torch.compile(silu_and_mul, dynamic=True))


def time_s(torch: Any, fn: Callable[[], object], warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    pairs = []
    for _ in range(reps):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return float(statistics.median(s.elapsed_time(e) for s, e in pairs)) / 1e3


def measure_case(torch: Any, model: ModelSpec, case: StepCase, reps: int,
                 fused: tuple[Callable[..., Any], Callable[..., Any]] | None
                 ) -> dict[str, float]:
    step = Step(torch, model, case.batch, case.context, chunk=case.chunk, prefix=case.prefix,
                fused=fused)
    with torch.inference_mode():
        eager = time_s(torch, step, 3, max(5, reps // 4))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the default stream, as capture wants
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        graphed = time_s(torch, graph.replay, 3, reps)
    del graph, step
    torch.cuda.empty_cache()
    return {"graph_s": graphed, "eager_s": eager}


def render(payload: dict[str, Any]) -> str:
    rows = [{"case": r["case"], "predicted_gpu_ms": r["predicted_gpu_s"] * 1e3,
             "measured_graph_ms": r["graph_s"] * 1e3, "error_%": r["error"] * 100,
             "measured_eager_ms": r["eager_s"] * 1e3,
             "predicted_full_ms": r["predicted_full_s"] * 1e3} for r in payload["rows"]]
    head = (f"Decode step of {payload['model']} (TP 1) on {payload['device_name']}, "
            f"predicted for {payload['gpu']}; CUDA graph replays, median of {payload['reps']}; "
            f"elementwise ops {'fused' if payload['fused'] else 'unfused'}. "
            f"MAPE {payload['mape'] * 100:.1f} % (predicted GPU time vs graph replay).\n\n")
    return head + markdown_table(rows, floatfmt=".3g")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", default="H100-SXM", help="catalog GPU the predictions are for")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--md", type=Path, default=None, help="default: --json with .md")
    ap.add_argument("--model", default=MODEL, choices=sorted(STEPS))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--no-fuse", action="store_true",
                    help="run the elementwise ops unfused (several torch ops each)")
    args = ap.parse_args(argv)
    try:
        gpu = get_gpu(args.gpu)
    except UnknownGPUError as exc:
        ap.error(str(exc))
    model = get_model(args.model)
    steps, max_cached = STEPS[args.model]
    cases = [StepCase(*c) for c in steps if c[0] * c[1] <= max_cached]
    try:
        import torch
    except ImportError:
        print("sim_gpu_step: needs torch with CUDA", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("sim_gpu_step: no CUDA device (this check needs a GPU)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    fused = None if args.no_fuse else fuse(torch)
    t0 = time.perf_counter()
    rows = []
    for case in cases:
        gpu_s, full_s = predicted_s(model, gpu.name, case)
        try:
            got = measure_case(torch, model, case, args.reps, fused)
        except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:  # logged, the run goes on
            print(f"{case.label}: FAILED {exc!r}"[:300], file=sys.stderr)
            torch.cuda.empty_cache()
            continue
        error = gpu_s / got["graph_s"] - 1
        rows.append({"case": case.label, "batch": case.batch, "context": case.context,
                     "chunk": case.chunk, "prefix": case.prefix,
                     "predicted_gpu_s": gpu_s, "predicted_full_s": full_s, **got,
                     "error": error})
        print(f"{case.label}: predicted {gpu_s * 1e3:.2f} ms, graph {got['graph_s'] * 1e3:.2f}"
              f" ms, eager {got['eager_s'] * 1e3:.2f} ms", file=sys.stderr)
    if not rows:
        print("sim_gpu_step: every case failed (see above)", file=sys.stderr)
        return 1
    payload = {"model": args.model, "gpu": gpu.name, "device_name": torch.cuda.get_device_name(0),
               "torch": torch.__version__, "reps": args.reps, "fused": not args.no_fuse,
               "mape": statistics.mean(abs(r["error"]) for r in rows),
               "wall_s": time.perf_counter() - t0, "rows": rows}
    md = render(payload)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(_clean(payload), indent=2) + "\n")
        (args.md or args.json.with_suffix(".md")).write_text(md)
    else:
        sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
