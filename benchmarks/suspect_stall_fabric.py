"""Requests in flight to a node that goes silent, with real processes: how long they stall.

An ingress and two serving nodes (`llmfabric start` + simulated engine each) on loopback;
`--clients` loops send short chat requests through the ingress. Node B is frozen with
SIGSTOP (its kernel still accepts connections and ACKs, nothing answers: a cut-off site as
seen after the connect, and SWIM's probes of it fail), then thawed with SIGCONT, `--trials`
times. Reported per trial: when the ingress's fleet API stopped listing B as routable (its
suspicion, polled every 50 ms), the longest of the requests that overlapped the freeze (its
stall), and how long after that detection the last request sent before it was answered.
Run it once per code version, the same way, with PYTHONPATH pointing at the tree to measure:

    PYTHONPATH=src python benchmarks/suspect_stall_fabric.py --json benchmarks/results/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _common import write_results

from llmfabric.launch.local import EngineSpec, LocalFabric

MODEL = "llama-3.1-8b"


class Clients:
    def __init__(self, url: str, n: int) -> None:
        self.url = url
        self.records: list[tuple[float, float, str]] = []  # (sent, answered, node or error)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()

    def _loop(self) -> None:
        body = json.dumps(
            {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        ).encode()
        while not self.stop.is_set():
            req = urllib.request.Request(
                self.url + "/v1/chat/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            )
            t0 = time.monotonic()
            try:
                with urllib.request.urlopen(req, timeout=60) as resp:
                    resp.read()
                    who = resp.headers.get("X-Fabric-Node") or "?"
            except Exception as e:  # a failed request is a result too
                who = f"error: {e!r}"[:200]
            self.records.append((t0, time.monotonic(), who))

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=70)


def _trial(fab: LocalFabric, victim: Any, clients: Clients, freeze_s: float) -> dict[str, Any]:
    time.sleep(1.0)
    t_freeze = time.monotonic()
    victim.signal(signal.SIGSTOP)
    t_detect = None
    try:
        while time.monotonic() - t_freeze < freeze_s:
            if t_detect is None and fab.serving_models().get(MODEL, 0) < 2:
                t_detect = time.monotonic()
            time.sleep(0.05)
    finally:
        victim.signal(signal.SIGCONT)
    t_thaw = time.monotonic()
    fab.wait_serving({MODEL: 2}, timeout=60)
    time.sleep(1.0)
    if t_detect is None:
        return {"detected_s": None}
    # Requests that overlapped the freeze; the poll's "detection" comes up to one poll (and
    # one fleet API call) after the ingress's own view changed.
    during = [(s, a, who) for s, a, who in clients.records if s < t_thaw and a > t_freeze]
    caught = [(s, a) for s, a, _ in during if s < t_detect < a]
    return {
        "detected_s": t_detect - t_freeze,
        "requests": len(during),
        "longest_stall_s": max((a - s for s, a, _ in during), default=0.0),
        "last_answer_after_detection_s": max((a - t_detect for _, a in caught), default=0.0),
        "errors": sum(1 for *_, who in during if who.startswith("error")),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--freeze", type=float, default=4.0, help="seconds node B stays frozen")
    ap.add_argument("--preset", default="lan", choices=["local", "lan", "wan"])
    ap.add_argument("--label", default="", help="what code this run measures")
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args()
    rows = []
    with (
        tempfile.TemporaryDirectory() as root,
        LocalFabric(pathlib.Path(root), preset=args.preset, auth=False) as fab,
    ):
        fab.start_ingress("--connect-timeout", "2", "--first-byte-timeout", "3")
        fab.add_node(EngineSpec(MODEL, "H100-SXM", provider="a", speed=50.0))
        victim = fab.add_node(EngineSpec(MODEL, "H100-SXM", provider="b", speed=50.0))
        fab.wait_serving({MODEL: 2}, timeout=120)
        assert fab.ingress is not None
        clients = Clients(fab.ingress.http_url, args.clients)
        try:
            for i in range(args.trials):
                rows.append({"trial": i, **_trial(fab, victim, clients, args.freeze)})
        finally:
            clients.close()
    load = os.getloadavg()
    stalls = [r["longest_stall_s"] for r in rows if r.get("detected_s") is not None]
    summary = {
        "label": args.label,
        "median_longest_stall_s": statistics.median(stalls) if stalls else None,
    }
    write_results(
        args.json,
        {
            "args": vars(args) | {"json": str(args.json)},
            "rows": rows,
            "summary": summary,
            "loadavg": load,
        },
        f"Requests in flight to a frozen node ({args.label or 'this tree'})",
        rows,
        notes=f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; preset "
        f"{args.preset}; ingress timeouts connect 2 s, first byte 3 s; "
        f"{args.clients} client loops; node B frozen {args.freeze} s.",
    )


if __name__ == "__main__":
    main()
