"""Simulator vs a GPU measured in the same run: one decoder layer's GEMMs, attention, HBM copy.

    PYTHONPATH=src python3 benchmarks/sim_gpu_check.py --gpu H100-SXM \
        --json results/sim_gpu_check.json --md results/sim_gpu_check.md [--quick]
    PYTHONPATH=src python3 benchmarks/sim_gpu_check.py --gpu H100-SXM --device cpu --quick

Cases (BF16, batch of one layer, per-GPU shard shapes under tensor parallelism TP):
- GEMMs of Llama-3.1-8B (TP 1) and Llama-3.1-70B (TP 1, 4, 8): the fused QKV, output, fused
  gate/up and down projections, as `operators.layer_linear_ops` shards them (gemm_n, gemm_k),
  for M tokens in {1, 8, 32, 128, 512, 2048, 8192};
- prefill attention: `scaled_dot_product_attention`, causal, one sequence of 512/2048/8192
  tokens, the shard's query and KV heads (GQA via `enable_gqa`);
- decode attention: the same SDPA call with one query token per sequence over a DENSE K/V
  tensor, batch 1/16/64/256 x context 1024/4096. vLLM runs paged FlashAttention kernels, so this
  is an approximation of its decode kernel (no block table, no split-KV combine of its own);
- a device-to-device copy (bytes read + written / time = achieved HBM bandwidth).

Timing: CUDA events around every repetition, after warm-ups, median of >= 20 repetitions.
Before every repetition a 256 MiB buffer is read (summed): it flushes L2, so every repetition
reads cold data as a serving step does, and it keeps the GPU busy while the host enqueues the
timed kernel (the launch latency is not in the interval). Not zeroed, as triton's do_bench
does (`--flush write`): that leaves L2 full of dirty lines, which the timed kernel must write
back as it reads; on an H100 it made GEMMs with M <= 128 measure a median 20 % slower than
with the read flush (docs/simulator.md).

Predictions come from the simulator's own functions for the named GPU and its calibration
(`calibration.efficiency_for`): `costs.op_time` of the `operators` OpCost of each GEMM (one
kernel, cold reads: the serving costs) and `costs.attention_time` of the fused attention of
`operators.attention_prefill_ops` / `attention_decode_ops` with the same key floor, KV floor,
serial-KV and wave terms that `benchmarks/sim_accuracy.py` uses for aiconfigurator's kernels.
Reported: predicted, measured, signed error (predicted / measured - 1), MAPE per operator class
(gemm, attn_prefill, attn_decode, hbm_copy), per projection, and overall.

`--device cpu` times the same cases on the CPU (cases above a size budget are skipped) so the
script can be run end to end without a GPU; the predictions are still for `--gpu` and the
errors are then meaningless (labelled so in the output). Without `--device cpu`, the script
exits with status 2 when torch.cuda is not available.

Needs torch, numpy and llmfabric.sim (numpy, pyyaml); torch is imported only to measure.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import _clean, markdown_table

from llmfabric.sim.calibration import Efficiency, efficiency_for
from llmfabric.sim.costs import (
    attention_time,
    decode_extra_waves,
    decode_serial_kv_bytes,
    op_time,
)
from llmfabric.sim.errors import UnknownGPUError
from llmfabric.sim.gpu_names import catalog_name
from llmfabric.sim.hardware import GPUSpec, get_gpu
from llmfabric.sim.models import ModelSpec, get_model
from llmfabric.sim.operators import (
    OpCost,
    attention_decode_ops,
    attention_prefill_ops,
    heads_per_gpu,
    layer_linear_ops,
)

DEPLOYMENTS = (
    ("llama-3.1-8b", 1),
    ("llama-3.1-70b", 1),
    ("llama-3.1-70b", 4),
    ("llama-3.1-70b", 8),
    ("qwen3-32b", 1),
)
GEMM_OPS = ("qkv_proj", "o_proj", "mlp_gate_up", "mlp_down")
# Token counts of a step: powers of two, and counts just past a multiple of 128 as chunked
# prefill makes them (decodes + a chunk: 1024 + 16), which a GEMM pays a whole extra row of
# tiles for.
GEMM_M = (1, 8, 32, 128, 512, 1040, 2048, 2112, 8192)
PREFILL_SEQ = (512, 2048, 8192)
DECODE_BATCH = (1, 16, 64, 256)
DECODE_CTX = (1024, 4096)
COPY_BYTES = (32 << 20, 256 << 20, 1 << 30)
# --quick: fewer shapes (every class and deployment is still covered)
QUICK_GEMM_M = (1, 32, 512, 8192)
QUICK_PREFILL_SEQ = (512, 8192)
QUICK_DECODE_BATCH = (1, 64, 256)
QUICK_COPY_BYTES = (32 << 20, 1 << 30)
FLUSH_BYTES = 256 << 20  # > 2 x the H100's 50 MiB L2
# --device cpu: skip cases above these (2 shared cores; the CPU run only proves the pipeline)
CPU_MAX_FLOPS = 2e9
CPU_MAX_BYTES = 64 << 20
DECODE_NOTE = (
    "decode attention is timed with torch's scaled_dot_product_attention over a "
    "dense K/V tensor (one query token per sequence); vLLM uses paged "
    "FlashAttention kernels, so these rows approximate its decode kernel"
)


@dataclass(frozen=True, slots=True)
class Case:
    """One measured operator. `shape` fields by class: gemm (m, n, k), attn_prefill (seq),
    attn_decode (batch, context), hbm_copy (nbytes); heads are the shard's."""

    cls: str  # gemm | attn_prefill | attn_decode | hbm_copy
    op: str  # qkv_proj, o_proj, mlp_gate_up, mlp_down, attention, copy
    model: str
    tp: int
    m: int = 0
    n: int = 0
    k: int = 0
    seq: int = 0
    batch: int = 0
    context: int = 0
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    nbytes: int = 0

    @property
    def label(self) -> str:
        if self.cls == "gemm":
            return f"{self.model} TP{self.tp} {self.op} m={self.m} ({self.n}x{self.k})"
        if self.cls == "attn_prefill":
            return f"{self.model} TP{self.tp} prefill seq={self.seq} h={self.heads}/{self.kv_heads}"
        if self.cls == "attn_decode":
            return (
                f"{self.model} TP{self.tp} decode b={self.batch} ctx={self.context} "
                f"h={self.heads}/{self.kv_heads}"
            )
        return f"copy {self.nbytes / 2**20:.0f} MiB"


def gemm_cases(ms: Sequence[int]) -> list[Case]:
    """The projections of one layer of every deployment, shaped as the simulator shards them."""
    out = []
    for name, tp in DEPLOYMENTS:
        ops = {op.name: op for op in layer_linear_ops(get_model(name), tp)}
        for op_name in GEMM_OPS:
            op = ops[op_name]
            for m in ms:
                out.append(Case("gemm", op_name, name, tp, m=m, n=op.gemm_n, k=op.gemm_k))
    return out


def attention_cases(
    seqs: Sequence[int], batches: Sequence[int], contexts: Sequence[int]
) -> list[Case]:
    out = []
    for name, tp in DEPLOYMENTS:
        model = get_model(name)
        nh, nkv = heads_per_gpu(model, tp)
        d = model.head_dim
        out += [
            Case(
                "attn_prefill",
                "attention",
                name,
                tp,
                seq=s,
                batch=1,
                heads=nh,
                kv_heads=nkv,
                head_dim=d,
            )
            for s in seqs
        ]
        out += [
            Case(
                "attn_decode",
                "attention",
                name,
                tp,
                batch=b,
                context=c,
                heads=nh,
                kv_heads=nkv,
                head_dim=d,
            )
            for b in batches
            for c in contexts
        ]
    return out


def copy_cases(sizes: Sequence[int]) -> list[Case]:
    return [Case("hbm_copy", "copy", "-", 1, nbytes=n) for n in sizes]


def all_cases(quick: bool) -> list[Case]:
    if quick:
        return (
            gemm_cases(QUICK_GEMM_M)
            + attention_cases(QUICK_PREFILL_SEQ, QUICK_DECODE_BATCH, DECODE_CTX)
            + copy_cases(QUICK_COPY_BYTES)
        )
    return (
        gemm_cases(GEMM_M)
        + attention_cases(PREFILL_SEQ, DECODE_BATCH, DECODE_CTX)
        + copy_cases(COPY_BYTES)
    )


def _linear(case: Case) -> OpCost:
    ops = {op.name: op for op in layer_linear_ops(get_model(case.model), case.tp)}
    return ops[case.op].cost(case.m)


def work(case: Case) -> tuple[float, float]:
    """(FLOPs, bytes moved) the simulator counts for `case` (attention: the fused kernel)."""
    if case.cls == "gemm":
        c = _linear(case)
        return c.flops, c.bytes
    if case.cls == "hbm_copy":
        return 0.0, 2.0 * case.nbytes
    ops = _attention_ops(case, get_model(case.model))
    return sum(o.flops for o in ops if o.tensor), sum(o.bytes for o in ops)


def _attention_ops(case: Case, model: ModelSpec) -> tuple[OpCost, ...]:
    if case.cls == "attn_prefill":
        return attention_prefill_ops(model, case.tp, case.seq, 0)
    return attention_decode_ops(model, case.tp, case.batch, float(case.batch * case.context))


def predict(case: Case, gpu: GPUSpec, eff: Efficiency) -> float:
    """Seconds the simulator predicts for `case` on `gpu` (cold reads, one kernel), through
    the same functions and terms as its serving costs and `sim_accuracy.py`."""
    if case.cls == "gemm":
        return op_time(_linear(case), gpu, eff, 16)
    if case.cls == "hbm_copy":
        return op_time(OpCost("copy", 0.0, 2.0 * case.nbytes, tensor=False), gpu, eff, 16)
    model = get_model(case.model)
    ops = _attention_ops(case, model)
    nh, nkv = heads_per_gpu(model, case.tp)
    d = model.head_dim
    if case.cls == "attn_prefill":  # the key floor: one key's FLOPs per query row
        return attention_time(ops, gpu, eff, 16, floor_flops=4.0 * nh * d * case.seq)
    kv_token = 2.0 * nkv * d * model.kv_bits / 8
    return attention_time(
        ops,
        gpu,
        eff,
        16,
        floor_bytes=case.batch * kv_token,
        serial_bytes=case.context * decode_serial_kv_bytes(model, case.tp),
        extra_waves=decode_extra_waves(gpu, case.batch, nkv),
    )


def within_cpu_budget(case: Case) -> bool:
    flops, moved = work(case)
    if case.cls in ("attn_prefill", "attn_decode"):  # the dense Q/K/V tensors allocated
        moved = 2.0 * (
            case.batch * max(case.seq, case.context) * case.kv_heads * case.head_dim * 2
            + case.batch * max(case.seq, 1) * case.heads * case.head_dim * 2
        )
    return flops <= CPU_MAX_FLOPS and moved <= CPU_MAX_BYTES


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """MAPE (fraction) overall, per operator class and per op of the GEMMs; rows: with
    `cls`, `op` and `error` (predicted / measured - 1)."""
    by_cls: dict[str, list[float]] = defaultdict(list)
    by_op: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        by_cls[r["cls"]].append(abs(r["error"]))
        if r["cls"] == "gemm":
            by_op[r["op"]].append(abs(r["error"]))
    every = [abs(r["error"]) for r in rows]
    return {
        "mape": statistics.fmean(every) if every else float("nan"),
        "rows": len(every),
        "mape_by_class": {c: statistics.fmean(v) for c, v in sorted(by_cls.items())},
        "mape_by_gemm_op": {o: statistics.fmean(v) for o, v in sorted(by_op.items())},
    }


# --- measurement (torch imported lazily: the pure parts above need no torch) ---


class Timer:
    """Times a thunk: CUDA events (flush L2 before each repetition) or perf_counter on CPU."""

    def __init__(
        self, torch: Any, device: str, warmup: int, reps: int, flush: str = "read"
    ) -> None:
        self.torch, self.device, self.warmup, self.reps = torch, device, warmup, reps
        self.flush = (
            torch.zeros(FLUSH_BYTES, dtype=torch.uint8, device=device) if device == "cuda" else None
        )
        # read: sum the buffer: L2 ends full of clean lines, as a decode step's earlier
        # weight reads leave it. write: zero it (triton's do_bench): L2 ends full of DIRTY
        # lines, which the timed kernel must write back as it reads. none: no flush (a
        # weight that fits in L2 stays there, and launch latency falls in the interval).
        self.flush_mode = flush
        self._as_f32 = self.flush.view(torch.float32) if self.flush is not None else None

    def median_s(self, fn: Callable[[], object]) -> float:
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        if self.flush is None:
            times = []
            for _ in range(self.reps):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            return statistics.median(times)
        torch.cuda.synchronize()
        events = []
        for _ in range(self.reps):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            if self.flush_mode == "write":
                self.flush.zero_()
            elif self.flush_mode == "read":
                self._as_f32.sum()
            start.record()
            fn()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
        return float(statistics.median(s.elapsed_time(e) for s, e in events)) / 1e3


def thunk(case: Case, torch: Any, device: str, sdpa: Callable[..., Any]) -> Callable[[], object]:
    """Allocates the case's tensors (BF16, random) and returns the call to time."""
    bf16 = torch.bfloat16
    if case.cls == "gemm":
        x = torch.randn(case.m, case.k, dtype=bf16, device=device)
        w = torch.randn(case.n, case.k, dtype=bf16, device=device)
        return lambda: torch.nn.functional.linear(x, w)
    if case.cls == "hbm_copy":
        src = torch.empty(case.nbytes, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)
    q_len = case.seq if case.cls == "attn_prefill" else 1
    kv_len = case.seq if case.cls == "attn_prefill" else case.context
    q = torch.randn(case.batch, case.heads, q_len, case.head_dim, dtype=bf16, device=device)
    k = torch.randn(case.batch, case.kv_heads, kv_len, case.head_dim, dtype=bf16, device=device)
    v = torch.randn_like(k)
    causal = case.cls == "attn_prefill"
    gqa = case.heads != case.kv_heads
    return lambda: sdpa(q, k, v, is_causal=causal, enable_gqa=gqa)


def _sdpa(torch: Any, backend: str) -> Callable[..., Any]:
    fn = torch.nn.functional.scaled_dot_product_attention
    if backend == "default":
        return fn  # type: ignore[no-any-return]
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[backend]

    def call(*args: Any, **kwargs: Any) -> Any:
        with sdpa_kernel(chosen):
            return fn(*args, **kwargs)

    return call


def measure(
    cases: Sequence[Case],
    gpu: GPUSpec,
    eff: Efficiency,
    device: str,
    warmup: int,
    reps: int,
    backend: str,
    log: Callable[[str], None],
    flush: str = "read",
) -> tuple[list[dict[str, Any]], list[str], dict[str, Any]]:
    import torch

    torch.manual_seed(0)
    timer = Timer(torch, device, warmup, reps, flush)
    sdpa = _sdpa(torch, backend)
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    failed: list[str] = []
    kernels: dict[str, list[str]] = {}
    for i, case in enumerate(cases):
        if device == "cpu" and not within_cpu_budget(case):
            skipped.append(case.label)
            continue
        try:  # one failing case (memory, an SDPA backend refusing a shape) must not end the run
            fn = thunk(case, torch, device, sdpa)
            measured = timer.median_s(fn)
        except RuntimeError as exc:
            failed.append(f"{case.label}: {str(exc).splitlines()[0][:200]}")
            log(f"[{i + 1}/{len(cases)}] {case.label}: FAILED {failed[-1]}")
            fn = None
            if device == "cuda":
                torch.cuda.empty_cache()
            continue
        del fn
        predicted = predict(case, gpu, eff)
        flops, moved = work(case)
        rows.append(
            {
                "cls": case.cls,
                "op": case.op,
                "case": case.label,
                "predicted_us": predicted * 1e6,
                "measured_us": measured * 1e6,
                "error": predicted / measured - 1,
                "measured_tflops": flops / measured / 1e12,
                "measured_gbps": moved / measured / 1e9,
                "case_fields": asdict(case),
            }
        )
        log(
            f"[{i + 1}/{len(cases)}] {case.label}: predicted {predicted * 1e6:.1f} us, "
            f"measured {measured * 1e6:.1f} us"
        )
    if device == "cuda":  # after all timing, so the profiler cannot perturb it
        for row in rows:
            if row["cls"] not in kernels:
                case = Case(**row["case_fields"])
                make = functools.partial(thunk, case, torch, device, sdpa)
                kernels[case.cls] = kernel_names(torch, make)
        torch.cuda.synchronize()
        backends: Any = torch.backends.cuda
        env = {
            "device_name": torch.cuda.get_device_name(0),
            "cuda": torch.version.cuda,
            "sdpa_flash": backends.flash_sdp_enabled(),
            "sdpa_cudnn": backends.cudnn_sdp_enabled(),
            "sdpa_efficient": backends.mem_efficient_sdp_enabled(),
        }
    else:
        env = {"device_name": "cpu", "threads": torch.get_num_threads()}
    env["torch"] = torch.__version__
    env["kernels_first_case"] = kernels
    env["failed"] = failed
    return rows, skipped, env


def kernel_names(torch: Any, make: Callable[[], Callable[[], object]]) -> list[str]:
    """GPU kernels one call of the thunk `make()` builds launches (which GEMM / SDPA kernel
    torch picked), or a note when that fails."""
    try:
        from torch.profiler import ProfilerActivity, profile

        fn = make()

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        events = prof.key_averages()
        on_gpu = [e.key for e in events if getattr(e.device_type, "name", "") == "CUDA"]
        return sorted({k[:120] for k in (on_gpu or [e.key for e in events])})
    except Exception as exc:  # the names are a diagnostic; timing goes on without them
        return [f"profiler unavailable: {type(exc).__name__}: {str(exc)[:100]}"]


def render(payload: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    s = payload["summary"]
    lines = [
        f"Predictions: {payload['gpu']} ({payload['efficiency_source']}); measured on "
        f"{payload['env'].get('device_name')} (torch {payload['env'].get('torch')}, "
        f"{payload['reps']} reps, median; L2 flush: {payload.get('flush', 'write')}).",
        f"MAPE overall {s['mape'] * 100:.1f} % over {s['rows']} cases; by class: "
        + ", ".join(f"{c} {v * 100:.1f} %" for c, v in s["mape_by_class"].items())
        + "; GEMMs by op: "
        + ", ".join(f"{o} {v * 100:.1f} %" for o, v in s["mape_by_gemm_op"].items())
        + ".",
        f"Note: {DECODE_NOTE}.",
    ]
    if payload["device"] == "cpu":
        lines.insert(
            0,
            "**CPU RUN: the measurements are CPU times, the predictions are for "
            f"{payload['gpu']}: the errors say nothing about the simulator.**",
        )
    if payload["hbm_copy_gbps"]:
        lines.append(
            "Achieved copy bandwidth (read + write): "
            + ", ".join(f"{k}: {v:.0f} GB/s" for k, v in payload["hbm_copy_gbps"].items())
            + f" (spec {payload['gpu_mem_bw_gbps']:.0f} GB/s)."
        )
    if payload["device"] == "cuda" and payload["env"].get("catalog_gpu") != payload["gpu"]:
        lines.insert(
            0,
            f"**WARNING: measured on {payload['env'].get('device_name')} (catalog "
            f"{payload['env'].get('catalog_gpu')}), predicted for {payload['gpu']}.**",
        )
    if payload["env"].get("failed"):
        lines.append("FAILED cases: " + "; ".join(payload["env"]["failed"]))
    if payload["env"].get("kernels_first_case"):
        lines.append(
            "Kernels (first case of each class): "
            + "; ".join(
                f"{c}: {', '.join(k)}" for c, k in payload["env"]["kernels_first_case"].items()
            )
        )
    if payload["skipped"]:
        lines.append(f"Skipped (over the CPU size budget): {len(payload['skipped'])} cases.")
    table = [
        {
            "case": r["case"],
            "predicted_us": r["predicted_us"],
            "measured_us": r["measured_us"],
            "error_%": r["error"] * 100,
            "TFLOP/s": r["measured_tflops"],
            "GB/s": r["measured_gbps"],
        }
        for r in rows
    ]
    return (
        f"# Simulator vs measured ({payload['gpu']})\n\n"
        + "  \n".join(lines)
        + "\n\n"
        + markdown_table(table, floatfmt=".3g")
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--gpu", default="H100-SXM", help="catalog GPU the predictions are for")
    ap.add_argument("--json", type=Path, default=None, help="write the JSON here")
    ap.add_argument(
        "--md",
        type=Path,
        default=None,
        help="write the markdown table here (default: --json with .md)",
    )
    ap.add_argument("--quick", action="store_true", help="fewer shapes (< ~2 min on an H100)")
    ap.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: time on the CPU (pipeline check; errors meaningless)",
    )
    ap.add_argument(
        "--reps",
        type=int,
        default=None,
        help="timed repetitions per case (default 20 with --quick, else 50; >= 20 on CUDA)",
    )
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument(
        "--sdpa-backend",
        default="default",
        choices=("default", "flash", "cudnn", "efficient", "math"),
        help="force one SDPA backend (default: torch's own choice)",
    )
    ap.add_argument(
        "--flush",
        default="read",
        choices=("write", "read", "none"),
        help="L2 before each repetition: read (default: sum 256 MiB, L2 left full of clean "
        "lines, as a decode step's earlier weight reads leave it), write (zero 256 MiB, as "
        "triton's do_bench: dirty lines the timed kernel must write back), none (no flush; "
        "the launch latency falls inside the interval)",
    )
    args = ap.parse_args(argv)
    reps = args.reps if args.reps is not None else (20 if args.quick else 50)
    if args.device == "cuda" and reps < 20:
        ap.error("--reps must be >= 20 on CUDA")
    if reps < 1 or args.warmup < 0:
        ap.error("--reps must be >= 1 and --warmup >= 0")
    try:
        gpu = get_gpu(args.gpu)
    except UnknownGPUError as exc:
        ap.error(str(exc))
    eff = efficiency_for(gpu)
    try:
        import torch
    except ImportError:
        print("sim_gpu_check: torch is not installed", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "sim_gpu_check: torch.cuda is not available (no GPU or a CPU-only torch); "
            "use --device cpu to check the pipeline on the CPU",
            file=sys.stderr,
        )
        return 2
    cases = all_cases(args.quick)
    t0 = time.perf_counter()
    rows, skipped, env = measure(
        cases,
        gpu,
        eff,
        args.device,
        args.warmup,
        reps,
        args.sdpa_backend,
        lambda s: print(s, file=sys.stderr),
        args.flush,
    )
    detected = catalog_name(env["device_name"]) if args.device == "cuda" else None
    if args.device == "cuda" and detected != gpu.name:
        print(
            f"sim_gpu_check: WARNING: the device is {env['device_name']!r} (catalog: "
            f"{detected}), the predictions are for {gpu.name}",
            file=sys.stderr,
        )
    env["catalog_gpu"] = detected
    copy_gbps = {r["case"]: r["measured_gbps"] for r in rows if r["cls"] == "hbm_copy"}
    payload = {
        "gpu": gpu.name,
        "efficiency_source": ("calibrated row" if eff != Efficiency() else "default factors"),
        "efficiency": asdict(eff),
        "device": args.device,
        "env": env,
        "quick": args.quick,
        "reps": reps,
        "warmup": args.warmup,
        "sdpa_backend": args.sdpa_backend,
        "flush": args.flush,
        "timing": f"CUDA events, L2 flush before every repetition: {args.flush}, median"
        if args.device == "cuda"
        else "perf_counter per repetition, median (CPU)",
        "errors_meaningful": args.device == "cuda",
        "decode_note": DECODE_NOTE,
        "summary": summarize(rows),
        "hbm_copy_gbps": copy_gbps,
        "gpu_mem_bw_gbps": gpu.mem_bw / 1e9,
        "wall_s": time.perf_counter() - t0,
        "skipped": skipped,
        "rows": rows,
    }
    md = render(payload, rows)
    if args.json is None and args.md is None:
        sys.stdout.write(md)
        return 0
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(_clean(payload), indent=2) + "\n")
    md_path: Path = args.md or args.json.with_suffix(".md")
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(md)
    print(
        f"MAPE {payload['summary']['mape'] * 100:.1f} % over {len(rows)} cases "
        f"({payload['wall_s']:.0f} s); wrote {args.json or ''} {md_path}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
