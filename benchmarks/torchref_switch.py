"""The torch reference engine: DP <-> TP switch cutover and tokens/s per layout (issue 15).

    .venv/bin/python benchmarks/torchref_switch.py --json results/torchref_switch.json

Two engine processes (gloo on loopback, one torch thread each).
- Cutover: `--switches` round trips 1 -> 2 -> 1 with the hard-preempt method, idle and with
  4 DP requests decoding. `cutover_ms` is first to last engine entering the new layout (each
  engine stamps CLOCK_MONOTONIC, shared by all processes, when its first plan of the new layout
  arrives); `latency_ms` is from the switch request to the end of the first step in the new
  layout (it includes that step's compute). Goal (COMPANIONS F5): cutover < 50 ms.
- Tokens/s: `--concurrency` greedy requests (32-token prompts, `--tokens` output tokens,
  EOS ignored) served entirely in one layout: DP (spread over both engines) or TP (one
  2-wide group), for each preset. Output tokens/s over the whole run, and the mean step time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import markdown_table, pct, write_results

from llmfabric.engines.torchref.config import ByteTokenizer, load_config
from llmfabric.engines.torchref.engine import EngineOptions, FlyingEngine

TOK = ByteTokenizer()


def _settle(eng: FlyingEngine, width: int) -> None:
    eng.switch(width, "hard")
    for _ in range(10_000):
        eng.step()
        s = eng.sched
        if s.width == width and not s.pending_bind and not s.pending_release and \
                s._unrecorded is None:
            return
    raise RuntimeError("switch did not settle")


def cutover(eng: FlyingEngine, switches: int, loaded: bool) -> dict[str, Any]:
    reqs = []
    if loaded:
        reqs = [eng.submit(TOK.encode(f"background {i} " * 4), 10_000 // 16, ignore_eos=True)
                for i in range(4)]
        for _ in range(3):
            eng.step()
    start = len(eng.sched.switches)
    for _ in range(switches):
        _settle(eng, 2)
        if loaded:
            eng.step()
        _settle(eng, 1)
        if loaded:
            eng.step()
    recs = eng.sched.switches[start:]
    for r in reqs:
        eng.sched.cancel(r)
    eng.step()
    cut = [1e3 * r.cutover_s for r in recs if r.cutover_s is not None]
    lat = [1e3 * r.latency_s for r in recs if r.latency_s is not None]
    return {"case": "loaded (4 DP requests)" if loaded else "idle", "switches": len(recs),
            "cutover_ms_p50": statistics.median(cut), "cutover_ms_p90": pct(cut, 0.9),
            "cutover_ms_max": max(cut), "latency_ms_p50": statistics.median(lat),
            "latency_ms_p90": pct(lat, 0.9), "latency_ms_max": max(lat)}


def throughput(eng: FlyingEngine, width: int, concurrency: int, tokens: int
               ) -> dict[str, Any]:
    _settle(eng, width)
    prompts = [TOK.encode(f"{i:02d} " + "the quick brown fox " * 2)[:32]
               for i in range(concurrency)]
    reqs = [eng.submit(p, tokens, ignore_eos=True) for p in prompts]
    step0 = eng.sched.step_no
    t0 = time.perf_counter()
    eng.run_until_done(reqs)
    wall = time.perf_counter() - t0
    steps = eng.sched.step_no - step0
    out = sum(len(r.output) for r in reqs)
    return {"layout": "DP x2" if width == 1 else f"TP {width}", "concurrency": concurrency,
            "output_tokens": out, "wall_s": wall, "tokens_per_s": out / wall,
            "mean_step_ms": 1e3 * wall / steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--switches", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--presets", default="tiny-llama,small-llama")
    ap.add_argument("--concurrency", default="1,8")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    cut_rows: list[dict[str, Any]] = []
    load = os.getloadavg()
    for i, preset in enumerate(args.presets.split(",")):
        cfg = load_config(preset)
        with FlyingEngine(EngineOptions(config=cfg, dp=2, widths=(1, 2))) as eng:
            if i == 0:
                cut_rows = [cutover(eng, args.switches, False),
                            cutover(eng, args.switches, True)]
                for r in cut_rows:
                    r["preset"] = preset
            for conc in (int(c) for c in args.concurrency.split(",")):
                for width in (1, 2):
                    row = throughput(eng, width, conc, args.tokens)
                    row["preset"] = f"{preset} ({cfg.params() / 1e6:.1f}M)"
                    rows.append(row)
    goal_met = all(r["cutover_ms_max"] < 50 for r in cut_rows)
    payload = {"cutover": cut_rows, "throughput": rows, "cutover_goal_ms": 50,
               "cutover_goal_met": goal_met, "loadavg_before": load,
               "loadavg_after": os.getloadavg(), "cpus": os.cpu_count()}
    notes = "Switch cutover (2 engine processes, hard preempt):\n\n"
    notes += markdown_table(cut_rows, ["preset", "case", "switches", "cutover_ms_p50",
                                       "cutover_ms_p90", "cutover_ms_max", "latency_ms_p50",
                                       "latency_ms_p90", "latency_ms_max"])
    notes += (f"\nGoal cutover < 50 ms: {'MET' if goal_met else 'MISSED'}. Load average "
              f"before {load[0]:.2f}, after {os.getloadavg()[0]:.2f} on {os.cpu_count()} "
              "CPUs.\n\nTokens/s per layout:")
    write_results(args.json, payload, "Torch reference engine: switch cutover and tokens/s",
                  rows, notes, ["preset", "layout", "concurrency", "output_tokens", "wall_s",
                                "tokens_per_s", "mean_step_ms"])


if __name__ == "__main__":
    main()
