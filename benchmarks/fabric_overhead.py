"""Control-plane overhead of the deployed path (OpenTela §5, Fig. 5), in ONE run.

    python benchmarks/fabric_overhead.py --json OUT.json [--duration 3] [--rounds 3]
        [--engine sim|vllm|llamacpp]

`--engine vllm|llamacpp` puts a REAL engine behind the provider node (vLLM CPU or
llama-cpp-python's server from scripts/install-engines.sh, serving the tiny Llama that
tests/engine/tinymodel.py builds; no download): what the fabric adds in front of a real
engine, same run, same requests (prompt of ~240 tokens of the tiny tokenizer, 16 outputs).

`benchmarks/ingress_overhead.py` measures the standalone ingress in front of a mock backend.
This measures what a consumer of a running fabric pays: real `llmfabric start` processes on
loopback (an ingress node with API keys on, and a provider node supervising `llmfabric engine
sim`, Qwen3-1.7B on a simulated GH200 as in the paper), the same requests sent to
- `direct`: the engine itself (no fabric),
- `fabric`: the ingress node's HTTP port (the lean front; other paths handed to aiohttp) ->
  provider node -> engine,
- `fabric-fast`: the ingress node's `--api-listen` lean front -> provider node -> engine,
(the provider's forward route is no longer measured alone: it is HTTPS pinned to the node
key with a per-request authorization only an ingress holding a data-plane session can make;
docs/network.md "Data plane"), interleaved in rounds (medians of the rounds), at concurrency
1 and 16 (closed loop, keep-alive connections, one asyncio client). Streamed chat requests
(256-token prompt, 16 output tokens, `ignore_eos`) give TTFT (first non-empty content chunk)
and end-to-end time; non-streamed ones give request latency. Reported: p50/p95 and the ADDED
time vs `direct` for each path.

Routing lookup: the ingress's candidate lookup + policy pick (`RecordsCandidateSource`
.candidates + `Router.route`, what runs per request on the local replica), timed in-process on
synthetic replicas of 8/64/512 nodes, in microseconds; plus the index rebuild after a replica
change. Every phase is bounded; writes JSON + a markdown table (OUT.md beside OUT.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import closed_loop, parse_head, pct, until, write_results

MODEL = "qwen3-1.7b"
GPU = "GH200"
PROMPT = "word " * 252  # ~256 prompt tokens with the chat template overhead (sim: chars/4 + 4)
MAX_TOKENS = 16
CONCURRENCY = (1, 16)
IGNORE_EOS = True
_CONTENT = re.compile(rb'"content": ?"[^"]')


# --------------------------------------------------------------------------------------------
# Load generator: raw asyncio HTTP/1.1 keep-alive client
# --------------------------------------------------------------------------------------------

def request_bytes(port: int, path: str, stream: bool, headers: dict[str, str]) -> bytes:
    doc: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}],
                           "max_tokens": MAX_TOKENS, "stream": stream}
    if IGNORE_EOS:
        doc["ignore_eos"] = True
    body = json.dumps(doc).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
            ).encode() + body


async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
              req: bytes) -> tuple[int, float, float, bool]:
    """(status, e2e_s, ttft_s, keep_alive); ttft: first non-empty content chunk (streams) or
    the whole body (non-streamed)."""
    t0 = time.perf_counter()
    writer.write(req)
    head = await reader.readuntil(b"\r\n\r\n")
    status, length, chunked, keep = parse_head(head)
    ttft = 0.0
    if length is not None:
        await reader.readexactly(length)
        ttft = time.perf_counter() - t0
    elif chunked:
        while True:
            n = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if n == 0:
                await reader.readuntil(b"\r\n")
                break
            data = await reader.readexactly(n + 2)
            if not ttft and _CONTENT.search(data):
                ttft = time.perf_counter() - t0
    else:
        await reader.read()
        keep = False
    e2e = time.perf_counter() - t0
    return status, e2e, ttft or e2e, keep


async def load(port: int, req: bytes, concurrency: int, duration: float) -> dict[str, Any]:
    ok, errors = await closed_loop(port, concurrency, lambda r, w: one(r, w, req),
                                   until(time.perf_counter() + duration))
    e2e = [total for total, _ in ok]
    ttft = [first for _, first in ok]
    return {"n": len(ok), "errors": errors,
            "e2e_p50_ms": pct(e2e, 0.5) * 1e3, "e2e_p95_ms": pct(e2e, 0.95) * 1e3,
            "ttft_p50_ms": pct(ttft, 0.5) * 1e3, "ttft_p95_ms": pct(ttft, 0.95) * 1e3}


# --------------------------------------------------------------------------------------------
# Routing lookup (in-process)
# --------------------------------------------------------------------------------------------

def lookup_us(n_nodes: int, policy: str, iters: int = 20000) -> dict[str, float]:
    from llmfabric.ingress.sources import RecordsCandidateSource
    from llmfabric.registry.records import (
        Hardware,
        Lifecycle,
        NodeMeta,
        NodeRecord,
        ServedModel,
    )
    from llmfabric.routing import Router, RouteRequest, make_policy

    rng = random.Random(n_nodes)
    models = ["llama-3.1-8b", "qwen3-1.7b", "llama-3.3-70b", "mistral-7b"]
    gpus = ["H100-SXM", "A100-80GB", "GH200", "L40S", "RTX-3090"]
    recs = [(NodeRecord(
        session_id=f"s{i:05d}", peer_id=f"p{i}", public_key=b"", state=Lifecycle.SERVING,
        incarnation=0, version=1, updated_at=0.0,
        meta=NodeMeta(provider_id=f"prov{i % 7}", http_addr=f"10.0.{i // 250}.{i % 250}:8090",
                      hardware=Hardware(gpu_model=rng.choice(gpus), gpu_count=1),
                      models=(ServedModel(models[i % len(models)]),)),
    ), i % 50 == 49) for i in range(n_nodes)]
    version = [0]
    source = RecordsCandidateSource(lambda: recs, lambda: version[0])
    router = Router(make_policy(policy, random.Random(1)))
    req = RouteRequest("qwen3-1.7b", prefix=PROMPT[:512])
    batches = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(iters // 5):
            router.route(req, source.candidates(req.model))
        batches.append((time.perf_counter_ns() - t0) / (iters // 5) / 1e3)
    rebuild = []
    for _ in range(20):
        version[0] += 1
        t0 = time.perf_counter_ns()
        source.candidates(req.model)
        rebuild.append((time.perf_counter_ns() - t0) / 1e3)
    return {"lookup_pick_us": statistics.median(batches),
            "index_rebuild_us": statistics.median(rebuild)}


# --------------------------------------------------------------------------------------------
# The fabric
# --------------------------------------------------------------------------------------------

Target = tuple[int, str, dict[str, str]]  # port, path, extra headers


REPO = Path(__file__).resolve().parents[1]


def real_engine_command(engine: str, root: Path, port: int) -> list[str]:
    """Install (cached) the engine, build the tiny model, return the engine command."""
    import subprocess

    subprocess.run([str(REPO / "scripts" / "install-engines.sh"), engine], check=True)
    home = Path(os.environ.get("LLMFABRIC_ENGINES_HOME",
                               Path.home() / ".cache" / "llmfabric-engines"))
    venv = home / ("vllm-venv" if engine == "vllm" else "llamacpp-venv")
    builder = [str(venv / "bin" / "python"), str(REPO / "tests" / "engine" / "tinymodel.py"),
               str(root / "model")]
    if engine == "vllm":
        subprocess.run(builder, check=True)
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        return [str(venv / "bin" / "vllm"), "serve", str(root / "model" / "hf"), "--port",
                str(port), "--max-model-len", "1024", "--dtype", "float32",
                "--served-model-name", MODEL]
    subprocess.run([*builder, "--gguf"], check=True)
    return [str(venv / "bin" / "python"), "-m", "llama_cpp.server", "--model",
            str(root / "model" / "tiny-f32.gguf"), "--port", str(port), "--n_ctx", "1024",
            "--model_alias", MODEL]


def start_fabric(root: Path, speed: float, engine: str = "sim"
                 ) -> tuple[Any, dict[str, Target]]:
    from llmfabric.launch.local import EngineSpec, LocalFabric
    from llmfabric.net.ports import free_port

    fab = LocalFabric(root)
    api_port = free_port()
    ingress = fab.start_ingress("--api-listen", f"127.0.0.1:{api_port}")
    if engine == "sim":
        node = fab.add_node(EngineSpec(MODEL, GPU, provider="bench", speed=speed))
    else:
        port = free_port()
        node = fab.add_process_node(real_engine_command(engine, root, port), "bench",
                                    "--provider", "bench", engine_port=port)
    fab.wait_serving({MODEL: 1}, timeout=600)
    key = {"Authorization": f"Bearer {fab.admin_key()}"}
    assert node.engine_port is not None
    targets: dict[str, Target] = {
        "direct": (node.engine_port, "/v1/chat/completions", {}),
        "fabric": (ingress.http_port, "/v1/chat/completions", key),
        "fabric-fast": (api_port, "/v1/chat/completions", key),
    }
    return fab, targets


def median_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": sum(r["n"] for r in rounds),
                           "errors": sum(r["errors"] for r in rounds)}
    for k in rounds[0]:
        if k.endswith("_ms"):
            out[k] = statistics.median(r[k] for r in rounds)
    return out


async def measure(targets: dict[str, Target], duration: float,
                  rounds: int) -> dict[str, dict[str, dict[str, Any]]]:
    raw: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in range(rounds):
        for c in CONCURRENCY:
            for kind in ("stream", "plain"):
                names = list(targets)
                if r % 2:
                    names.reverse()  # interleave: no path always runs first
                for name in names:
                    port, path, headers = targets[name]
                    req = request_bytes(port, path, kind == "stream", headers)
                    await load(port, req, c, min(0.5, duration))  # warm connections/caches
                    got = await load(port, req, c, duration)
                    raw.setdefault((name, kind, c), []).append(got)
                    print(f"round {r + 1}/{rounds} c{c} {kind:6} {name:12} n={got['n']:5} "
                          f"err={got['errors']} ttft p50 {got['ttft_p50_ms']:.2f} ms "
                          f"e2e p50 {got['e2e_p50_ms']:.2f} ms", flush=True)
    result: dict[str, dict[str, dict[str, Any]]] = {}
    for (name, kind, c), rs in raw.items():
        result.setdefault(name, {})[f"{kind}_c{c}"] = median_of(rs)
    return result


def added(paths: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, float]]:
    direct = paths["direct"]
    out: dict[str, dict[str, float]] = {}
    for name, phases in paths.items():
        if name == "direct":
            continue
        row: dict[str, float] = {}
        for c in CONCURRENCY:
            s, d = phases[f"stream_c{c}"], direct[f"stream_c{c}"]
            p, dp = phases[f"plain_c{c}"], direct[f"plain_c{c}"]
            row[f"ttft_p50_ms_c{c}"] = s["ttft_p50_ms"] - d["ttft_p50_ms"]
            row[f"ttft_p95_ms_c{c}"] = s["ttft_p95_ms"] - d["ttft_p95_ms"]
            row[f"stream_e2e_p50_ms_c{c}"] = s["e2e_p50_ms"] - d["e2e_p50_ms"]
            row[f"p50_ms_c{c}"] = p["e2e_p50_ms"] - dp["e2e_p50_ms"]
            row[f"p95_ms_c{c}"] = p["e2e_p95_ms"] - dp["e2e_p95_ms"]
        out[name] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, default=None, help="write JSON here (+ .md beside)")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per phase")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--speed", type=float, default=1.0,
                    help="simulated engine speed-up (1: the GH200 timing model)")
    ap.add_argument("--engine", choices=["sim", "vllm", "llamacpp"], default="sim",
                    help="engine behind the provider node (real ones: see the docstring)")
    args = ap.parse_args()
    global MODEL, PROMPT, GPU, IGNORE_EOS
    if args.engine != "sim":
        # The tiny model's tokenizer knows these words: ~240 prompt tokens; random weights
        # rarely emit EOS, and llama-cpp-python has no ignore_eos.
        MODEL, GPU, IGNORE_EOS = "tiny", "cpu", False
        PROMPT = "the fabric routes requests to engines " * 40
    started = time.time()
    load_before = os.getloadavg()
    lookups = {f"{policy}_{n}": lookup_us(n, policy)
               for n in (8, 64, 512) for policy in ("random", "least_outstanding",
                                                     "prefix_affinity")}
    with tempfile.TemporaryDirectory(prefix="fabric-overhead-") as tmp:
        fab, targets = start_fabric(Path(tmp), args.speed, args.engine)
        try:
            paths = asyncio.run(measure(targets, args.duration, args.rounds))
        finally:
            fab.close()
    add = added(paths)
    payload = {
        "config": {"model": MODEL, "gpu": GPU, "engine": args.engine,
                   "engine_speed": args.speed,
                   "prompt_tokens": 256, "max_tokens": MAX_TOKENS, "duration_s": args.duration,
                   "rounds": args.rounds, "concurrency": list(CONCURRENCY),
                   "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
                   "wall_s": round(time.time() - started, 1), "cpus": os.cpu_count()},
        "paths": paths, "added": add, "lookup": lookups,
    }
    rows: list[dict[str, Any]] = []
    for name, extra in add.items():
        rows.append({"path": name, **{k: round(v, 3) for k, v in extra.items()}})
    for name in paths:
        row: dict[str, Any] = {"path": f"{name} (absolute)"}
        for c in CONCURRENCY:
            s = paths[name][f"stream_c{c}"]
            p = paths[name][f"plain_c{c}"]
            row.update({f"ttft_p50_ms_c{c}": round(s["ttft_p50_ms"], 3),
                        f"ttft_p95_ms_c{c}": round(s["ttft_p95_ms"], 3),
                        f"p50_ms_c{c}": round(p["e2e_p50_ms"], 3),
                        f"p95_ms_c{c}": round(p["e2e_p95_ms"], 3)})
        rows.append(row)
    lookup_rows = ", ".join(f"{k}: {v['lookup_pick_us']:.2f} us (rebuild "
                            f"{v['index_rebuild_us']:.0f} us)" for k, v in lookups.items())
    notes = (f"Added time vs the engine called directly (ms; p50/p95 of {args.rounds} "
             f"interleaved rounds of {args.duration} s phases), "
             + ("Qwen3-1.7B on a simulated GH200, 256-token prompts"
                if args.engine == "sim" else f"real {args.engine} (CPU) serving a tiny Llama, "
                "~240-token prompts") +
             f", {MAX_TOKENS} output tokens. Load average before "
             f"{load_before[0]:.2f}. Routing lookup + pick per request: {lookup_rows}.")
    columns = ["path"] + [f"{m}_c{c}" for c in CONCURRENCY for m in (
        "ttft_p50_ms", "ttft_p95_ms", "p50_ms", "p95_ms")]
    write_results(args.json, payload, "Fabric control-plane overhead", rows, notes, columns)
    print(json.dumps(add, indent=2))


if __name__ == "__main__":
    main()
