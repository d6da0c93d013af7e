"""Ingress overhead: direct vs our ingress vs peer routers, in ONE run on this machine.

    python benchmarks/ingress_overhead.py --json OUT.json [--duration 4] [--peers ...]

Starts a fast mock OpenAI backend (raw asyncio, two processes), then measures each router in
front of it with a separate load-generator process (raw asyncio HTTP/1.1 keep-alive client):
- added p50/p99 latency at concurrency 1 and added p50 at concurrency 32 (vs direct),
- maximum requests/s (best of concurrency 32 and 64),
- streaming (64 chunks, 1 ms apart): time to first byte, and per-chunk overhead (p50 delay
  of a chunk from the backend's write to the client's read, via the router minus direct; each
  chunk carries its send time, CLOCK_MONOTONIC being shared by all processes),
- router CPU% (all its processes, from /proc; 100% = one core) during the concurrency-32 phase,
  and the router's CPU time per request served in that phase (us): the comparison that holds on
  a shared machine, where the others' load moves every router's requests/s from run to run.
Peers are installed by the script into their own venvs under a cache dir (pip: litellm[proxy],
vllm-router, sglang-router; apt-get: nginx when root); a peer that cannot be installed or
started is skipped with the reason. Every phase is bounded in time. Writes JSON + a markdown
table (OUT.md beside OUT.json).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import closed_loop, parse_head, pct

from llmfabric.net.ports import free_port

N_CHUNKS = 64
CHUNK_GAP_S = 0.001
MODEL = "mock"

# --------------------------------------------------------------------------------------------
# The mock OpenAI backend (raw asyncio protocol; a separate process)
# --------------------------------------------------------------------------------------------

_COMPLETION = json.dumps({
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}).encode()
_CHUNK = json.dumps({
    "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
    "choices": [{"index": 0, "delta": {"content": "tok "}, "finish_reason": None}],
}).encode()
_LAST = json.dumps({
    "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
}).encode()
_MODELS = json.dumps({"object": "list", "data": [
    {"id": MODEL, "object": "model", "created": 1, "owned_by": "bench"}]}).encode()


def _http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _json_response(body: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % len(body)) + body


class MockBackend(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v.strip())
            total = end + 4 + length
            if len(self.buf) < total:
                return
            body = self.buf[end + 4:total]
            self.buf = self.buf[total:]
            self.respond(head.split(" ", 2), body)

    def respond(self, line: list[str], body: bytes) -> None:
        assert self.transport is not None
        if line[0] == "GET":
            self.transport.write(_json_response(_MODELS if "models" in line[1] else b"{}"))
            return
        if b'"stream":true' in body or b'"stream": true' in body:
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
            asyncio.get_running_loop().create_task(self.stream(self.transport))
            return
        self.transport.write(_json_response(_COMPLETION))

    async def stream(self, tr: asyncio.Transport) -> None:
        for i in range(N_CHUNKS):
            if tr.is_closing():
                return
            data = _LAST if i == N_CHUNKS - 1 else _CHUNK
            # The chunk's id carries its send time (CLOCK_MONOTONIC, shared by all processes),
            # so the load generator measures each chunk's delivery delay through the router.
            data = data.replace(b"chatcmpl-1", b"ts%d" % time.perf_counter_ns(), 1)
            tr.write(_http_chunk(b"data: " + data + b"\n\n"))
            await asyncio.sleep(CHUNK_GAP_S)
        tr.write(_http_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")


def serve_backend(port: int) -> None:
    _use_uvloop()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(MockBackend, "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def _use_uvloop() -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass


# --------------------------------------------------------------------------------------------
# The load generator (raw asyncio HTTP/1.1 keep-alive client; a separate process)
# --------------------------------------------------------------------------------------------

def _request_bytes(port: int, stream: bool, token: str) -> bytes:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 8, "stream": stream}).encode()
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


_TS = re.compile(rb'"id": ?"ts(\d+)"')


async def _one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: bytes,
               delays: list[int] | None = None) -> tuple[float, float, bool, int]:
    """Send one request; returns (total_s, ttfb_s, keep_alive, status)."""
    t0 = time.perf_counter()
    writer.write(req)
    head = await reader.readuntil(b"\r\n\r\n")
    status, length, chunked, keep = parse_head(head)
    ttfb = 0.0
    if length is not None:
        await reader.readexactly(length)
        ttfb = time.perf_counter() - t0
    elif chunked:
        while True:
            size_line = await reader.readuntil(b"\r\n")
            n = int(size_line.split(b";")[0], 16)
            if n == 0:
                await reader.readuntil(b"\r\n")
                break
            data = await reader.readexactly(n + 2)
            if not ttfb:
                ttfb = time.perf_counter() - t0
            if delays is not None and b'"ts' in data:
                now = time.perf_counter_ns()
                delays.extend(now - int(m) for m in _TS.findall(data))
    else:
        await reader.read()
        keep = False
        ttfb = time.perf_counter() - t0
    return time.perf_counter() - t0, ttfb, keep, status


async def _loadgen(port: int, concurrency: int, duration: float, max_requests: int,
                   stream: bool, token: str) -> dict[str, Any]:
    req = _request_bytes(port, stream, token)
    delays: list[int] | None = [] if stream else None
    deadline = time.perf_counter() + duration
    budget = [max_requests]

    def more() -> bool:
        budget[0] -= 1
        return time.perf_counter() < deadline and budget[0] >= 0

    async def exchange(reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> tuple[int, float, float, bool]:
        total, ttfb, keep, status = await _one(reader, writer, req, delays)
        return status, total, ttfb, keep

    t0 = time.perf_counter()
    ok, errors = await closed_loop(port, concurrency, exchange, more)
    elapsed = time.perf_counter() - t0
    totals = [total for total, _ in ok]
    return {"n": len(ok), "errors": errors, "elapsed": elapsed,
            "p50": pct(totals, 0.5), "p99": pct(totals, 0.99),
            "ttfb_p50": pct([first for _, first in ok], 0.5),
            "chunk_delay_p50_us": pct([d / 1e3 for d in delays], 0.5) if delays else None}


def run_loadgen_process(port: int, concurrency: int, duration: float, max_requests: int,
                        stream: bool, token: str) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        args = [sys.executable, __file__, "--loadgen",
                json.dumps([port, concurrency, duration, max_requests, stream, token, f.name])]
        subprocess.run(args, capture_output=True, timeout=duration + 60, check=True)
        result: dict[str, Any] = json.loads(Path(f.name).read_text())
    return result


# --------------------------------------------------------------------------------------------
# Processes: start, wait, CPU accounting, stop
# --------------------------------------------------------------------------------------------



def wait_http(port: int, within: float, path: str = "/v1/models",
              token: str = "sk-bench") -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                          f"Authorization: Bearer {token}\r\nConnection: close\r\n\r\n"
                          .encode())
                data = s.recv(64)
                if data.startswith(b"HTTP/1.1 200") or data.startswith(b"HTTP/1.0 200"):
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def _tree(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_seconds(pid: int) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime
        except (OSError, IndexError, ValueError):
            continue
    return total / ticks


def start(cmd: list[str], log: Path, env: dict[str, str] | None = None,
          cwd: str | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True, env=env, cwd=cwd)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


# --------------------------------------------------------------------------------------------
# Peers: installation and launch commands
# --------------------------------------------------------------------------------------------

def ensure_venv(cache: Path, name: str, spec: str, probe: str, timeout: float) -> Path:
    """A venv under the cache dir with `spec` installed; raises RuntimeError with a reason."""
    venv = cache / f"venv-{name}"
    if (venv / "bin" / probe).exists():
        return venv
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    try:
        r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", spec],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"pip install {spec} took more than {timeout:.0f} s") from e
    if r.returncode != 0 or not (venv / "bin" / probe).exists():
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"pip install {spec} failed: {tail[0][:200]}")
    return venv


def ensure_nginx(timeout: float) -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists()
                                      else None)
    if found:
        return found
    if os.geteuid() != 0:
        raise RuntimeError("nginx is not installed and apt-get needs root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True,
                       timeout=timeout, check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "nginx"], env=env,
                       capture_output=True, timeout=timeout, check=True)
    except (subprocess.SubprocessError, OSError) as e:
        raise RuntimeError(f"apt-get install nginx failed: {e}") from e
    found = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(found).exists():
        raise RuntimeError("apt-get install nginx did not provide an nginx binary")
    return found


def nginx_cmd(work: Path, port: int, backends: list[int], workers: int) -> list[str]:
    binary = ensure_nginx(300)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    ups = "\n".join(f"        server 127.0.0.1:{p};" for p in backends)
    conf = work / "nginx.conf"
    conf.write_text(textwrap.dedent(f"""\
        worker_processes {workers};
        pid {work}/nginx.pid;
        error_log {work}/logs/error.log warn;
        events {{ worker_connections 4096; }}
        http {{
          access_log off;
          upstream mock {{
        {ups}
            keepalive 128;
          }}
          server {{
            listen 127.0.0.1:{port} reuseport;
            location / {{
              proxy_pass http://mock;
              proxy_http_version 1.1;
              proxy_set_header Connection "";
              proxy_buffering off;
              tcp_nodelay on;
            }}
          }}
        }}
        """))
    return [binary, "-p", str(work), "-c", str(conf), "-g", "daemon off;"]


def llmfabric_cmd(port: int, backends: list[int], workers: int, auth_db: str | None
                  ) -> list[str]:
    cmd = [sys.executable, "-c", "from llmfabric.cli.main import main; main()", "ingress",
           "--port", str(port), "--workers", str(workers), "--max-retries", "1"]
    for p in backends:
        cmd += ["--backend", f"{MODEL}=127.0.0.1:{p}"]
    cmd += ["--db", auth_db] if auth_db else ["--no-auth"]
    return cmd


def make_key(db: str) -> str:
    from llmfabric.accounts.store import AccountStore

    async def go() -> str:
        store = await AccountStore.open(db, background=False)
        try:
            _, plaintext = await store.create_key("bench", "bench")
            return plaintext
        finally:
            await store.aclose()

    return asyncio.run(go())


def vllm_router_cmd(cache: Path, port: int, backends: list[int]) -> list[str]:
    venv = ensure_venv(cache, "vllm-router", "vllm-router", "vllm-router", 600)
    return [str(venv / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
            "--policy", "round_robin", "--prometheus-port", str(free_port()), "--worker-urls",
            *[f"http://127.0.0.1:{p}" for p in backends]]


def sglang_router_cmd(cache: Path, port: int, backends: list[int]) -> list[str]:
    venv = ensure_venv(cache, "sglang-router", "sglang-router", "python", 600)
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import sglang_router"],
                           capture_output=True, timeout=60)
    if probe.returncode != 0:
        venv = ensure_venv(cache, "sglang-router", "sglang-router", "__never__", 600)
    return [str(venv / "bin" / "python"), "-m", "sglang_router.launch_router",
            "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
            "--prometheus-port", str(free_port()), "--worker-urls",
            *[f"http://127.0.0.1:{p}" for p in backends]]


def litellm_cmd(cache: Path, work: Path, port: int, backends: list[int], workers: int
                ) -> list[str]:
    venv = ensure_venv(cache, "litellm", "litellm[proxy]", "litellm", 900)
    entries = "\n".join(textwrap.dedent(f"""\
          - model_name: {MODEL}
            litellm_params:
              model: openai/{MODEL}
              api_base: http://127.0.0.1:{p}/v1
              api_key: none""") for p in backends)
    cfg = work / "litellm.yaml"
    # A master key, as any deployment has (the same key the load generator sends).
    cfg.write_text("model_list:\n" + entries + "\ngeneral_settings:\n  master_key: sk-bench\n")
    return [str(venv / "bin" / "litellm"), "--config", str(cfg), "--host", "127.0.0.1",
            "--port", str(port), "--num_workers", str(workers)]


# --------------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------------

def measure(port: int, pid: int | None, duration: float, token: str) -> dict[str, Any]:
    """One round of every phase against one target."""
    lg = run_loadgen_process
    lg(port, 1, min(1.0, duration), 300, False, token)  # warm-up (connections, caches)
    c1 = lg(port, 1, duration, 20_000, False, token)
    cpu0, t0 = (cpu_seconds(pid), time.monotonic()) if pid else (0.0, 0.0)
    c32 = lg(port, 32, duration, 10**7, False, token)
    cpu_s = cpu_seconds(pid) - cpu0 if pid else None
    cpu = cpu_s / (time.monotonic() - t0) * 100 if cpu_s is not None else None
    c64 = lg(port, 64, duration, 10**7, False, token)
    st = lg(port, 1, duration, 2_000, True, token)
    return {
        "p50_ms_c1": c1["p50"] * 1e3, "p99_ms_c1": c1["p99"] * 1e3,
        "p50_ms_c32": c32["p50"] * 1e3,
        "max_rps": max(c32["n"] / c32["elapsed"], c64["n"] / c64["elapsed"]),
        "stream_ttfb_ms": st["ttfb_p50"] * 1e3,
        "stream_total_ms": st["p50"] * 1e3,
        "chunk_delay_us": st["chunk_delay_p50_us"],
        "cpu_percent": cpu,
        "cpu_us_per_request": cpu_s / c32["n"] * 1e6 if cpu_s is not None and c32["n"] else None,
        "requests": c1["n"] + c32["n"] + c64["n"] + st["n"],
        "errors": c1["errors"] + c32["errors"] + c64["errors"] + st["errors"],
    }


def median_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in rounds[0]:
        vals = [r[k] for r in rounds if r[k] is not None]
        if k in ("requests", "errors"):
            out[k] = sum(vals)
        else:
            out[k] = statistics.median(vals) if vals else None
    return out


def show(name: str, r: dict[str, Any]) -> None:
    cpu = r["cpu_percent"]
    print(f"  {name}: c1 p50 {r['p50_ms_c1']:.3f} ms, p99 {r['p99_ms_c1']:.3f} ms; "
          f"c32 p50 {r['p50_ms_c32']:.2f} ms; {r['max_rps']:.0f} req/s; stream ttfb "
          f"{r['stream_ttfb_ms']:.2f} ms, chunk delay {r['chunk_delay_us']} us; cpu "
          f"{'-' if cpu is None else round(cpu)}%, "
          f"{'-' if cpu is None else round(r['cpu_us_per_request'])} us per request; "
          f"errors {r['errors']}", flush=True)


def added(direct: dict[str, Any], r: dict[str, Any]) -> dict[str, Any]:
    return {
        "added_p50_ms_c1": round(r["p50_ms_c1"] - direct["p50_ms_c1"], 4),
        "added_p99_ms_c1": round(r["p99_ms_c1"] - direct["p99_ms_c1"], 4),
        "added_p50_ms_c32": round(r["p50_ms_c32"] - direct["p50_ms_c32"], 4),
        "max_rps": round(r["max_rps"], 1),
        "stream_ttfb_ms": round(r["stream_ttfb_ms"], 4),
        # p50 delay of a chunk from the backend's write to the client's read, minus direct's.
        "stream_chunk_overhead_us": None if r["chunk_delay_us"] is None
        or direct["chunk_delay_us"] is None
        else round(r["chunk_delay_us"] - direct["chunk_delay_us"], 2),
        "cpu_percent": None if r["cpu_percent"] is None else round(r["cpu_percent"], 1),
        "cpu_us_per_request": None if r["cpu_us_per_request"] is None
        else round(r["cpu_us_per_request"], 1),
        "errors": r["errors"],
        "raw": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()},
    }


def markdown(result: dict[str, Any]) -> str:
    cols = ["added_p50_ms_c1", "added_p99_ms_c1", "added_p50_ms_c32", "max_rps",
            "stream_ttfb_ms", "stream_chunk_overhead_us", "cpu_percent", "cpu_us_per_request"]
    lines = ["| router | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    d = result["direct"]
    lines.append("| direct (no router) | 0 | 0 | 0 | " + f"{d['max_rps']:.0f} | "
                 f"{d['stream_ttfb_ms']:.3f} | 0 | - | - |")
    for name, r in result["routers"].items():
        lines.append(f"| {name} | " + " | ".join(
            "-" if r[c] is None else (f"{r[c]:.0f}" if c in ("max_rps", "cpu_us_per_request")
                                else f"{r[c]:.3f}")
            for c in cols) + " |")
    for name, why in result["skipped"].items():
        lines.append(f"| {name} | skipped: {why} |" + " |" * (len(cols) - 1))
    meta = result["meta"]
    lines.append("")
    lines.append(f"{meta['cpus']} CPUs, load average at start {meta['loadavg']}, "
                 f"{meta['duration_s']} s per phase, medians of {meta['rounds']} interleaved "
                 f"rounds, {meta['backends']} mock backend processes,"
                 f" routers with {meta['workers']} workers where they have the option.")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", dest="json_out", type=Path)
    ap.add_argument("--duration", type=float, default=2.0, help="seconds per phase")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    ap.add_argument("--workers", type=int, default=2, help="router processes (ours, nginx, "
                    "LiteLLM)")
    ap.add_argument("--peers", default="nginx,vllm-router,sglang-router,litellm",
                    help="comma-separated peers to measure ('' for none)")
    ap.add_argument("--no-auth-variant", action="store_true",
                    help="skip measuring llmfabric with API-key auth on")
    ap.add_argument("--cache-dir", type=Path, default=Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llmfabric-bench")
    ap.add_argument("--backend", dest="serve_backend", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--loadgen", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_backend:
        serve_backend(args.serve_backend)
        return
    if args.loadgen:
        _use_uvloop()
        port, conc, dur, maxr, stream, token, out = json.loads(args.loadgen)
        Path(out).write_text(json.dumps(asyncio.run(_loadgen(port, conc, dur, maxr, stream,
                                                             token))))
        return
    if args.json_out is None:
        ap.error("--json OUT is required")
    run(args)


def run(args: argparse.Namespace) -> None:
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ingress-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    result: dict[str, Any] = {"routers": {}, "skipped": {}, "direct": {}, "meta": {
        "cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()],
        "duration_s": args.duration, "rounds": args.rounds, "workers": args.workers, "backends": 2,
        "chunks": N_CHUNKS, "chunk_gap_ms": CHUNK_GAP_S * 1e3,
    }}
    try:
        backends = [free_port(), free_port()]
        for p in backends:
            procs.append(start([sys.executable, __file__, "--backend", str(p)],
                               work / f"backend-{p}.log"))
        for p in backends:
            if not wait_http(p, 20):
                raise SystemExit(f"mock backend on port {p} did not start")
        targets: list[str] = ["llmfabric"]
        if not args.no_auth_variant:
            targets.append("llmfabric+auth")
        targets += [p for p in args.peers.split(",") if p]
        live: dict[str, tuple[int, int | None, str]] = {"direct": (backends[0], None, "sk-bench")}
        for name in targets:
            port = free_port()
            token = "sk-bench"
            env = None
            try:
                if name == "llmfabric":
                    cmd = llmfabric_cmd(port, backends, args.workers, None)
                elif name == "llmfabric+auth":
                    db = str(work / "accounts.db")
                    token = make_key(db)
                    cmd = llmfabric_cmd(port, backends, args.workers, db)
                elif name == "nginx":
                    cmd = nginx_cmd(work / "nginx", port, backends, args.workers)
                elif name == "vllm-router":
                    cmd = vllm_router_cmd(args.cache_dir, port, backends)
                elif name == "sglang-router":
                    cmd = sglang_router_cmd(args.cache_dir, port, backends)
                elif name == "litellm":
                    cmd = litellm_cmd(args.cache_dir, work, port, backends, args.workers)
                    env = {**os.environ, "LITELLM_LOG": "ERROR",
                           "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
                else:
                    result["skipped"][name] = "unknown peer name"
                    continue
            except (RuntimeError, subprocess.SubprocessError, OSError) as e:
                result["skipped"][name] = str(e)
                print(f"skipping {name}: {e}", flush=True)
                continue
            log = work / f"{name}.log"
            proc = start(cmd, log, env=env)
            procs.append(proc)
            if not wait_http(port, 180 if name == "litellm" else 30, token=token):
                tail = log.read_text(errors="replace").strip().splitlines()[-3:]
                why = f"did not answer GET /v1/models within the time limit: {' / '.join(tail)}"
                result["skipped"][name] = why[:400]
                print(f"skipping {name}: {why}", flush=True)
                stop(proc)
                continue
            live[name] = (port, proc.pid, token)
            print(f"started {name} on port {port}", flush=True)

        # Interleaved rounds (all routers stay up; idle ones cost nothing), medians per metric:
        # the machine's background load drifts, and this spreads the drift over every router.
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in live}
        for i in range(args.rounds):
            print(f"round {i + 1}/{args.rounds}", flush=True)
            for name, (port, pid, token) in live.items():
                try:
                    r = measure(port, pid, args.duration, token)
                except (subprocess.SubprocessError, ValueError, OSError) as e:
                    print(f"  {name}: measurement failed: {e}", flush=True)
                    continue
                rounds[name].append(r)
                show(name, r)
        for name, rs in rounds.items():
            if not rs:
                result["skipped"][name] = "every measurement round failed"
                continue
            med = median_rounds(rs)
            if name == "direct":
                result["direct"] = med
        direct = result["direct"]
        if not direct:
            raise SystemExit("could not measure the backend directly")
        for name, rs in rounds.items():
            if name != "direct" and rs:
                result["routers"][name] = added(direct, median_rounds(rs))
    finally:
        for proc in procs:
            stop(proc)
        shutil.rmtree(work, ignore_errors=True)
    result["direct"] = {k: (round(v, 4) if isinstance(v, float) else v)
                        for k, v in result["direct"].items()}
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    md = markdown(result)
    args.json_out.with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
