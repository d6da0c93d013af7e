"""How right is a stream's usage when the engine reports none, and what does counting cost?

    python benchmarks/usage_count.py --json OUT.json [--requests 24]

A REAL llama-cpp-python server (scripts/install-engines.sh; the tiny Llama of
tests/engine/tinymodel.py, no download), whose streams carry no usage. For each request
(completions and chat, prompts of 3 to ~300 tokens, 4 to 48 output tokens, temperature 0):
- `truth`: the engine's own usage for the same request unstreamed;
- `ingress estimate` (before): the stream fed to the ingress's StreamUsageScanner, which
  counts ceil(chars / 4) + 4 per message and the non-empty pieces (ingress/usage.py);
- `node count` (now): the stream through the node's EngineProxy with StreamUsageCounter
  (forward/stream_usage.py): the engine's tokenizer for the prompt, the token events.
Reported: exact matches and mean absolute error (%) of prompt and completion tokens, and the
time from request to the stream's last byte, plain relay vs counting relay (interleaved,
medians), i.e. what the held `[DONE]` waits for the tokenize call. JSON + markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results
from fabric_overhead import real_engine_command

from llmfabric.agent.engines import KINDS
from llmfabric.agent.tokenize import EngineTokenizer
from llmfabric.forward.engine_proxy import EngineProxy
from llmfabric.forward.stream_usage import StreamUsageCounter
from llmfabric.ingress.usage import StreamUsageScanner, estimate_prompt_tokens
from llmfabric.net.ports import free_port

TEXT = ("the fabric routes requests across providers and sites while engines stream tokens "
        "back through relays under load with failover")


def requests(n: int) -> list[tuple[str, dict[str, Any]]]:
    words = TEXT.split()
    out: list[tuple[str, dict[str, Any]]] = []
    for i in range(n):
        text = " ".join(words[(i * 7 + j) % len(words)] for j in range(2 + (i * 37) % 180))
        base = {"model": "tiny", "max_tokens": 4 + (i * 11) % 45, "temperature": 0, "seed": 1}
        if i % 2:
            out.append(("/v1/chat/completions",
                        {**base, "messages": [{"role": "user", "content": text}]}))
        else:
            out.append(("/v1/completions", {**base, "prompt": text}))
    return out


async def whole(proxy: EngineProxy, path: str, doc: dict[str, Any]) -> tuple[int, int]:
    up = await proxy.open(path, orjson.dumps(doc))
    try:
        usage = orjson.loads(await up.read())["usage"]
    finally:
        await up.aclose()
    return usage["prompt_tokens"], usage["completion_tokens"]


async def streamed(proxy: EngineProxy, path: str, doc: dict[str, Any]
                   ) -> tuple[bytes, float]:
    t0 = time.perf_counter()
    up = await proxy.open(path, orjson.dumps({**doc, "stream": True,
                                              "stream_options": {"include_usage": True}}))
    try:
        data = b"".join([c async for c in up.chunks()])
    finally:
        await up.aclose()
    return data, time.perf_counter() - t0


def node_usage(data: bytes) -> tuple[int, int]:
    for line in reversed(data.split(b"\n")):
        if line.startswith(b"data: {") and b'"usage"' in line:
            u = orjson.loads(line[6:])["usage"]
            return u["prompt_tokens"], u["completion_tokens"]
    raise AssertionError("the node sent no usage chunk")


def ingress_estimate(data: bytes, path: str, doc: dict[str, Any]) -> tuple[int, int]:
    scanner = StreamUsageScanner(strip_usage_chunk=False, want_usage_chunk=True)
    scanner.feed(data)
    scanner.flush()
    usage, _ = scanner.finish(estimate_prompt_tokens(doc), "tiny", "chat" in path)
    return usage.prompt, usage.completion


def errors(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part, i in (("prompt", 0), ("completion", 1)):
        errs = [abs(r[key][i] - r["truth"][i]) / max(1, r["truth"][i]) for r in rows]
        out[f"{part} exact"] = sum(1 for r in rows if r[key][i] == r["truth"][i])
        out[f"{part} MAE %"] = round(100 * statistics.fmean(errs), 1)
    return out


async def run(n: int, argv: list[str], base: str) -> dict[str, Any]:
    kind = KINDS["llama-cpp-python"]
    plain = EngineProxy(base)
    holder: dict[str, EngineProxy] = {}
    tokenizer = EngineTokenizer(kind, base, lambda: holder["p"].session())
    counter = StreamUsageCounter(kind, tokenizer, argv)
    counting = holder["p"] = EngineProxy(base, around=counter.open)
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(600):
                try:
                    async with s.get(base + "/v1/models") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        rows: list[dict[str, Any]] = []
        t_plain: list[float] = []
        t_count: list[float] = []
        for path, doc in requests(n):
            truth = await whole(plain, path, doc)
            raw, tp = await streamed(plain, path, doc)
            counted, tc = await streamed(counting, path, doc)
            t_plain.append(tp)
            t_count.append(tc)
            rows.append({"truth": truth, "ingress": ingress_estimate(raw, path, doc),
                         "node": node_usage(counted)})
    finally:
        await plain.aclose()
        await counting.aclose()
    table = [{"method": "ingress estimate (before)", **errors(rows, "ingress")},
             {"method": "node count (engine tokenizer + token events)", **errors(rows, "node")}]
    timing = {"stream end, plain relay (median ms)": round(1e3 * statistics.median(t_plain), 2),
              "stream end, counting relay (median ms)": round(1e3 * statistics.median(t_count),
                                                              2),
              "tokenized": counter.tokenized, "requests": n,
              "load average": os.getloadavg()[0]}
    return {"accuracy": table, "timing": timing, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=24)
    args = ap.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as root:
        argv = real_engine_command("llamacpp", Path(root), port)
        engine = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            result = asyncio.run(asyncio.wait_for(
                run(args.requests, argv, f"http://127.0.0.1:{port}"), 170))
        finally:
            engine.terminate()
            engine.wait(30)
    t = result["timing"]
    write_results(args.json, result, "Stream usage when the engine reports none",
                  result["accuracy"], notes="llama-cpp-python, tiny model; " + ", ".join(
                      f"{k}: {v}" for k, v in t.items()))
    print(orjson.dumps({k: result[k] for k in ("accuracy", "timing")},
                       option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
