"""A whole decode step on a GPU against the simulator's `decode_step_time`, in one run.

`sim_gpu_check.py` checks single kernels; this checks what the serving simulator adds them up
to. It builds one GPU's decode step of a dense Llama-style model in torch (BF16, random
weights, TP 1): embedding lookup, per layer RMSNorm, fused QKV GEMM, the new K/V written into
a dense cache, decode attention (`scaled_dot_product_attention` over the cache, GQA), output
projection, residual, RMSNorm, fused gate/up GEMM, SiLU x up, down GEMM, residual; then the
final norm, the LM head and a greedy pick. Rotary embeddings are left out (an elementwise op
on B x heads x 128 values, far under 1 % of the step). The step is captured in a CUDA graph,
as vLLM runs decode steps, and graph replays are timed with CUDA events (median); the same
step run eagerly is timed beside it, to show what kernel launches cost without a graph.

Predicted: `StepCostModel.decode_step_time(batch, batch x context)` minus `step_overhead_s`
(the per-iteration scheduler, sampling and launch-gap time, which a captured graph does not
have), so the comparison is GPU time against GPU time; the full prediction is reported too.

Run: `PYTHONPATH=src python3 benchmarks/sim_gpu_step.py --gpu H100-SXM --json OUT.json`
(torch with CUDA; exits with status 2 without it). Memory: weights ~16 GB plus the cache
(batch x context <= 262,144 tokens: ~34 GB for Llama-3.1-8B).
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

MODEL = "llama-3.1-8b"
# (batch, context): decode-only steps at the batch sizes a single-GPU engine runs
CASES = ((1, 1024), (8, 1024), (32, 1024), (64, 1024), (128, 1024), (256, 1024),
         (1, 4096), (16, 4096), (64, 4096), (384, 512), (512, 512))
MAX_CACHED_TOKENS = 256 * 1024


@dataclass(frozen=True)
class StepCase:
    batch: int
    context: int

    @property
    def label(self) -> str:
        return f"b={self.batch} ctx={self.context}"


def predicted_s(model: ModelSpec, gpu_name: str, case: StepCase) -> tuple[float, float]:
    """(GPU time, full step time) the simulator predicts for one decode step."""
    cm = cost_model(model, get_gpu(gpu_name), 1)
    full = cm.decode_step_time(case.batch, case.batch * case.context)
    return full - cm.step_overhead_s, full


class Step:
    """One GPU's decode step of `model` (TP 1), its weights and a dense KV cache."""

    def __init__(self, torch: Any, model: ModelSpec, batch: int, context: int,
                 device: str = "cuda") -> None:
        self.t, self.m, self.batch, self.context = torch, model, batch, context
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
        self.tokens = torch.randint(0, model.vocab, (batch,), device=dev)
        self.pos = torch.full((1,), context - 1, device=dev, dtype=torch.long)

    def rms(self, x: Any) -> Any:
        t = self.t
        return x * t.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype)

    def __call__(self) -> Any:
        t, m, b = self.t, self.m, self.batch
        f = t.nn.functional
        x = self.embed[self.tokens]
        for (w_qkv, w_o, w_gu, w_down), (k_cache, v_cache) in zip(self.layers, self.cache,
                                                                   strict=True):
            qkv = f.linear(self.rms(x), w_qkv)
            q, k, v = qkv.split((self.q_dim, self.kv_dim, self.kv_dim), dim=-1)
            k_cache.index_copy_(2, self.pos, k.view(b, m.n_kv_heads, 1, m.head_dim))
            v_cache.index_copy_(2, self.pos, v.view(b, m.n_kv_heads, 1, m.head_dim))
            attn = f.scaled_dot_product_attention(
                q.view(b, m.n_heads, 1, m.head_dim), k_cache, v_cache, enable_gqa=True)
            x = x + f.linear(attn.reshape(b, self.q_dim), w_o)
            gate, up = f.linear(self.rms(x), w_gu).chunk(2, dim=-1)
            x = x + f.linear(f.silu(gate) * up, w_down)
        return f.linear(self.rms(x), self.lm_head).argmax(-1)


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


def measure_case(torch: Any, model: ModelSpec, case: StepCase, reps: int) -> dict[str, float]:
    step = Step(torch, model, case.batch, case.context)
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
            f"predicted for {payload['gpu']}; CUDA graph replays, median of {payload['reps']}. "
            f"MAPE {payload['mape'] * 100:.1f} % (predicted GPU time vs graph replay).\n\n")
    return head + markdown_table(rows, floatfmt=".3g")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", default="H100-SXM", help="catalog GPU the predictions are for")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--md", type=Path, default=None, help="default: --json with .md")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args(argv)
    try:
        gpu = get_gpu(args.gpu)
    except UnknownGPUError as exc:
        ap.error(str(exc))
    model = get_model(MODEL)
    cases = [StepCase(b, c) for b, c in CASES if b * c <= MAX_CACHED_TOKENS]
    try:
        import torch
    except ImportError:
        print("sim_gpu_step: needs torch with CUDA", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("sim_gpu_step: no CUDA device (this check needs a GPU)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    t0 = time.perf_counter()
    rows = []
    for case in cases:
        gpu_s, full_s = predicted_s(model, gpu.name, case)
        try:
            got = measure_case(torch, model, case, args.reps)
        except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:  # logged, the run goes on
            print(f"{case.label}: FAILED {exc!r}"[:300], file=sys.stderr)
            torch.cuda.empty_cache()
            continue
        error = gpu_s / got["graph_s"] - 1
        rows.append({"case": case.label, "batch": case.batch, "context": case.context,
                     "predicted_gpu_s": gpu_s, "predicted_full_s": full_s, **got,
                     "error": error})
        print(f"{case.label}: predicted {gpu_s * 1e3:.2f} ms, graph {got['graph_s'] * 1e3:.2f}"
              f" ms, eager {got['eager_s'] * 1e3:.2f} ms", file=sys.stderr)
    payload = {"model": MODEL, "gpu": gpu.name, "device_name": torch.cuda.get_device_name(0),
               "torch": torch.__version__, "reps": args.reps,
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
