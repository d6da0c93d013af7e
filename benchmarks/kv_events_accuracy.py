"""Does a node's prefix sketch claim what a real vLLM holds? Events sketch vs served sketch.

Starts vLLM (CPU is enough: `scripts/install-engines.sh vllm`, the tiny model of
tests/engine/tinymodel.py) with `--kv-events-config` on a loopback endpoint that a
`KvEventsLink` binds (as a node does), `--num-gpu-blocks-override` small so it evicts, and
`--enable-prompt-tokens-details` so each answer says how many prompt tokens were cached.
Six prompts (three completions sharing a ~300-character prefix, three chats), then
`--resends` re-sends picked at random (seeded), `--concurrency` at a time. Before each group
of re-sends it reads the leading keys each sketch claims (`matched_blocks` / keys) from the
node's `HeldPrefixes` (KV events) and from `ServedPrefixes` (what was served), and compares
them with the fraction of the prompt vLLM then served from its cache. Forwarding is mimicked
exactly as the node does it: `observe` before the request, `finished` after the answer.

The run is journaled (observes, raw event frames, answers); `--replay JOURNAL` replays one
through the current `HeldPrefixes` without vLLM (deterministic).

    python benchmarks/kv_events_accuracy.py --vllm ~/.cache/llmfabric-engines/vllm-venv \\
        --model /tmp/engines-tiny/hf --seed 11 --journal /tmp/kv-journal.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import time
import urllib.request
from typing import Any

from llmfabric.agent.kv_events_config import KvEventsEndpoint
from llmfabric.net.ports import free_port
from llmfabric.node.engine_link import KvEventsLink
from llmfabric.registry.cache_sketch import matched_blocks
from llmfabric.routing.cache_summary import ServedPrefixes
from llmfabric.routing.held_prefixes import HeldPrefixes
from llmfabric.routing.kv_events import decode_message
from llmfabric.routing.prefix import block_keys, prompt_text

WORDS = (
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "river",
    "mountain",
    "forest",
    "harbor",
)


def prompts(seed: int) -> list[tuple[str, dict[str, Any]]]:
    rng = random.Random(seed)
    shared = " ".join(rng.choice(WORDS) for _ in range(60))
    out: list[tuple[str, dict[str, Any]]] = []
    for i in range(6):
        r = random.Random(1000 * seed + i)
        body = " ".join(r.choice(WORDS) for _ in range(170))
        if i % 2 == 0:
            out.append(("completions", {"prompt": shared + " " + body}))
        else:
            out.append(("chat/completions", {"messages": [{"role": "user", "content": body}]}))
    return out


def summary(rows: list[tuple[float, float, float]]) -> dict[str, float]:
    """rows: (events claim, served claim, cached fraction) per re-send."""
    out: dict[str, float] = {"resends": len(rows)}
    for j, name in ((0, "events"), (1, "served")):
        out[f"{name}_mean_abs_err"] = round(sum(abs(r[j] - r[2]) for r in rows) / len(rows), 3)
        out[f"{name}_claimed_none_cached"] = sum(1 for r in rows if r[j] > 0 and r[2] == 0)
        out[f"{name}_cached_not_claimed"] = sum(1 for r in rows if r[j] == 0 and r[2] > 0)
    return out


def replay(journal: list[Any]) -> dict[str, float]:
    """The journal through today's HeldPrefixes, at the recorded times (older journals:
    sends one second apart, answers 0.4 s in)."""
    now = [0.0]
    held, served = HeldPrefixes(lambda: now[0]), ServedPrefixes()
    claims: dict[int, tuple[float, float]] = {}
    tokens: dict[int, object | None] = {}
    rows: list[tuple[float, float, float]] = []
    for entry in journal:
        if entry[0] == "observe":
            n, keys, chars = entry[1], tuple(entry[3]), entry[4]
            now[0] = entry[5] if len(entry) > 5 else float(n)
            claims[n] = (
                matched_blocks(held.sketch(), keys) / len(keys),
                matched_blocks(served.sketch(), keys) / len(keys),
            )
            tokens[n] = held.observe(keys, chars)
            served.observe(keys, chars)
        elif entry[0] == "answer":
            n, prompt_tokens, cached = entry[1], entry[3], entry[4]
            now[0] = entry[5] if len(entry) > 5 else n + 0.4
            held.finished(tokens.get(n))
            if n >= 6:
                rows.append((*claims[n], cached / prompt_tokens))
        else:
            held.apply(decode_message([bytes.fromhex(x) for x in entry[1]], b"kv"))
    return summary(rows)


def start_vllm(args: argparse.Namespace, zport: int) -> tuple[subprocess.Popen[bytes], str]:
    """vLLM publishing to the endpoint the subscriber bound; (process, base URL) once up."""
    port = free_port()
    flag = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{zport}",
        "topic": "kv",
    }
    cmd = [
        os.path.join(args.vllm, "bin", "vllm"),
        "serve",
        args.model,
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--max-model-len",
        "1024",
        "--dtype",
        "float32",
        "--served-model-name",
        "tiny",
        "--max-num-seqs",
        "4",
        "--num-gpu-blocks-override",
        str(args.blocks),
        "--enable-prompt-tokens-details",
        "--kv-events-config",
        json.dumps(flag),
    ]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    with open(args.engine_log, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"

    while True:
        if proc.poll() is not None:
            raise SystemExit(f"vLLM exited ({proc.returncode}); see {args.engine_log}")
        try:
            urllib.request.urlopen(f"{base}/health", timeout=1).close()
            return proc, base
        except OSError:
            time.sleep(2)


async def live(args: argparse.Namespace) -> tuple[dict[str, float], list[Any]]:
    zport = free_port()
    held, served = HeldPrefixes(time.monotonic), ServedPrefixes()
    link = KvEventsLink(KvEventsEndpoint(f"tcp://127.0.0.1:{zport}", "kv"), held)
    journal: list[Any] = []
    handle = link.handle

    def journaled(frames: list[bytes]) -> None:
        journal.append(["frames", [f.hex() for f in frames]])
        handle(frames)

    link.handle = journaled  # type: ignore[method-assign]
    link.open()
    proc, base = await asyncio.to_thread(start_vllm, args, zport)

    def post(route: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(
            f"{base}/v1/{route}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=300) as r:
            out: dict[str, Any] = json.loads(r.read())
            return out

    try:
        todo = prompts(args.seed)
        rng = random.Random(args.seed)
        order = list(range(len(todo))) + [rng.randrange(len(todo)) for _ in range(args.resends)]
        rows: list[tuple[float, float, float]] = []
        t0 = time.monotonic()
        groups = [[n] for n in range(len(todo))]  # the first sends one at a time
        rest = list(range(len(todo), len(order)))
        groups += [rest[k : k + args.concurrency] for k in range(0, len(rest), args.concurrency)]

        async def send(n: int, claim: tuple[float, float], token: object | None) -> None:
            i = order[n]
            route, body = todo[i]
            out = await asyncio.to_thread(post, route, {"model": "tiny", "max_tokens": 2, **body})
            held.finished(token)
            usage = out["usage"]
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            journal.append(["answer", n, i, usage["prompt_tokens"], cached, time.monotonic() - t0])
            if n >= len(todo):
                rows.append((*claim, cached / usage["prompt_tokens"]))

        for group in groups:  # claims read before the group is sent
            sends = []
            for n in group:
                text = prompt_text(todo[order[n]][1])
                keys = block_keys(text)
                claim = (
                    matched_blocks(held.sketch(), keys) / len(keys),
                    matched_blocks(served.sketch(), keys) / len(keys),
                )
                token = held.observe(keys, len(text.encode()))
                served.observe(keys, len(text.encode()))
                journal.append(
                    ["observe", n, order[n], list(keys), len(text.encode()), time.monotonic() - t0]
                )
                sends.append(send(n, claim, token))
            await asyncio.gather(*sends)
            await asyncio.sleep(0.5)  # (the next group sees this one's events)
        result = summary(rows)
        result.update(
            chars_per_token=round(held.chars_per_token, 3),
            dropped=sum(link.dropped.values()),
            gaps=link.gaps,
        )
        return result, journal
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        await link.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vllm", help="the vLLM venv (scripts/install-engines.sh vllm)")
    ap.add_argument("--model", help="a model directory (tests/engine/tinymodel.py)")
    ap.add_argument("--blocks", type=int, default=16, help="vLLM's KV cache, in blocks")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--resends", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=1, help="re-sends sent together")
    ap.add_argument("--journal", help="write the run's journal here")
    ap.add_argument("--replay", help="replay this journal instead of running vLLM")
    ap.add_argument("--engine-log", default="vllm-kv-events.log")
    args = ap.parse_args()
    if args.replay:
        with open(args.replay) as f:
            print(json.dumps(replay(json.load(f))))
        return
    if not args.vllm or not args.model:
        ap.error("--vllm and --model are needed (or --replay)")
    result, journal = asyncio.run(live(args))
    if args.journal:
        with open(args.journal, "w") as f:
            json.dump(journal, f)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
