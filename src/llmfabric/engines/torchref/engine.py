"""FlyingEngine: N engine processes (gloo on loopback) driven by one FlyingScheduler.

    with FlyingEngine(EngineOptions(config=load_config("tiny-llama"), dp=2)) as eng:
        req = eng.submit(prompt_ids, max_tokens=16)   # manual mode: the caller steps
        eng.run_until_done([req])
        eng.start_loop()                              # or a thread steps continuously

The coordinator (this process) hosts the TCPStore and a Listener, both on ephemeral loopback
ports; each worker (a `python -m llmfabric.engines.torchref.worker` subprocess in our process
group, so signals to the group reach it) connects back, joins the gloo world through the store
and builds every aligned group before it reports ready.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener, wait
from typing import Any

from llmfabric.engines.torchref.config import ModelConfig
from llmfabric.engines.torchref.plans import StepPlan, StepResult, WorkerSpec
from llmfabric.engines.torchref.scheduler import FlyingScheduler, Request
from llmfabric.scheduler.switching import Method, SwitchPolicy
from llmfabric.untrusted import format_exception


class EngineFailure(RuntimeError):
    """A worker died or raised; the engine cannot continue (its peers wait in collectives)."""


@dataclass(frozen=True, slots=True)
class EngineOptions:
    config: ModelConfig = field(default_factory=ModelConfig)
    dp: int = 2
    widths: tuple[int, ...] = (1, 2)
    n_blocks: int = 256  # per engine
    block_tokens: int = 16  # B_DP
    threads: int = 1  # torch threads per worker
    max_batch: int = 32
    # requests waiting for a batch slot (all engines' queues together) before the server
    # answers 503 with Retry-After (each holds its prompt and its client's connection)
    max_waiting: int = 1024
    # the highest `priority` a client's request gets (larger ones are clamped; negative ones
    # are kept: they only put the request itself later in line). 0: clients cannot jump the
    # queues or trigger the `priority` policy's preempt; `llmfabric engine torch` defaults
    # to 1 with --switch-policy priority, the policy's p_hi
    max_priority: int = 0
    policy: SwitchPolicy | None = None
    method: Method = "hard"
    start_timeout_s: float = 120.0


class ProcessExecutor:
    def __init__(self, conns: list[Connection], procs: list[subprocess.Popen[bytes]]) -> None:
        self.conns = conns
        self.procs = procs

    def _recv(self, rank: int) -> tuple[Any, ...]:
        conn = self.conns[rank]
        while not conn.poll(1.0):
            if self.procs[rank].poll() is not None:
                raise EngineFailure(f"engine {rank} exited with {self.procs[rank].returncode}")
        try:
            msg: tuple[Any, ...] = conn.recv()
        except (EOFError, OSError) as exc:
            raise EngineFailure(f"engine {rank} closed its connection") from exc
        if msg[0] == "error":
            raise EngineFailure(f"engine {rank} failed:\n{msg[1]}")
        return msg

    def execute(self, plans: dict[int, StepPlan]) -> list[StepResult]:
        try:
            for rank in sorted(plans):
                self.conns[rank].send(("step", plans[rank]))
        except OSError as exc:
            raise EngineFailure(f"engine connection lost: {exc}") from exc
        results: dict[int, StepResult] = {}
        waiting = {self.conns[r]: r for r in plans}
        while waiting:
            # wait on every engine at once: one that fails leaves its TP peers stuck in a
            # collective, so a failure anywhere must end the step, not only the next rank's
            ready = wait(list(waiting), timeout=1.0)
            for obj in ready:
                rank = next(r for c, r in waiting.items() if c is obj)
                del waiting[self.conns[rank]]
                results[rank] = self._recv(rank)[1]
            if not ready:
                dead = [r for r, p in enumerate(self.procs) if p.poll() is not None]
                if dead:
                    raise EngineFailure(f"engine {dead[0]} exited with "
                                        f"{self.procs[dead[0]].returncode}")
        return [results[r] for r in sorted(plans)]


class FlyingEngine:
    def __init__(self, options: EngineOptions) -> None:
        widths = tuple(sorted(set(options.widths) | {1}))
        for w in widths:
            options.config.check_width(w)
        self.options = options
        self.widths = widths
        self.procs: list[subprocess.Popen[bytes]] = []
        self.conns: list[Connection] = []
        self.ready: list[dict[str, Any]] = []
        self.scheduler: FlyingScheduler | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.failure: BaseException | None = None
        self._snapshot: dict[str, Any] | None = None

    # -- life cycle ---------------------------------------------------------------------

    def start(self) -> FlyingEngine:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        from torch.distributed import TCPStore  # type: ignore[attr-defined]

        opts = self.options
        store = TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
        self._store = store
        key = secrets.token_bytes(16)
        listener = Listener(("127.0.0.1", 0), authkey=key)
        host, port = listener.address
        env = {**os.environ, "LLMFABRIC_TORCHREF_KEY": key.hex()}
        try:
            for rank in range(opts.dp):
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "llmfabric.engines.torchref.worker",
                     f"{host}:{port}", str(rank)], env=env, stdin=subprocess.DEVNULL))
            conns: dict[int, Connection] = {}
            deadline = time.monotonic() + opts.start_timeout_s
            # accept in 1 s slices so a worker that dies while starting fails the start now
            listener._listener._socket.settimeout(1.0)  # type: ignore[attr-defined]
            while len(conns) < opts.dp:
                if time.monotonic() > deadline:
                    raise EngineFailure("engines did not connect in time")
                dead = [(r, p.returncode) for r, p in enumerate(self.procs)
                        if p.poll() is not None]
                if dead:
                    raise EngineFailure(f"engine {dead[0][0]} exited with {dead[0][1]} "
                                        "while starting")
                try:
                    conn = listener.accept()
                    hello = conn.recv()
                except (TimeoutError, AuthenticationError, EOFError, OSError):
                    continue  # nothing yet, or not one of ours (wrong key)
                rank = hello[1] if isinstance(hello, tuple) and len(hello) == 2 else -1
                if not isinstance(rank, int) or not 0 <= rank < opts.dp or rank in conns:
                    conn.close()
                    continue
                conn.send(WorkerSpec(rank, opts.dp, store.port, opts.config, self.widths,
                                     opts.n_blocks, opts.block_tokens, opts.threads))
                conns[rank] = conn
            self.conns = [conns[r] for r in range(opts.dp)]
            executor = ProcessExecutor(self.conns, self.procs)
            for rank in range(opts.dp):
                self.ready.append(executor._recv(rank)[1])
        except BaseException:
            self.close()
            raise
        finally:
            listener.close()
        self.scheduler = FlyingScheduler(
            executor, opts.dp, self.widths, opts.n_blocks, opts.block_tokens,
            opts.config.max_model_len, policy=opts.policy, max_batch=opts.max_batch)
        return self

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for conn in self.conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(("stop",))
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self.procs, self.conns = [], []

    def __enter__(self) -> FlyingEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def sched(self) -> FlyingScheduler:
        if self.scheduler is None:
            raise RuntimeError("the engine is not started")
        return self.scheduler

    # -- manual mode --------------------------------------------------------------------

    def submit(self, prompt: list[int], max_tokens: int, **kw: Any) -> Request:
        return self.sched.add(Request(list(prompt), max_tokens, **kw))

    def step(self) -> bool:
        return self.sched.step()

    def run_until_done(self, requests: list[Request], max_steps: int = 100_000) -> None:
        idle = 0
        for _ in range(max_steps):
            if all(r.finish is not None for r in requests):
                return
            idle = 0 if self.sched.step() else idle + 1
            if idle >= 3:  # nothing can run: paused under a bound group, or waiting for one
                raise RuntimeError("requests cannot progress in the current layout")
        raise RuntimeError("requests did not finish")

    def switch(self, width: int, method: Method | None = None) -> None:
        self.sched.switch_to(width, method or self.options.method)

    # -- threaded mode (the server) -----------------------------------------------------

    def start_loop(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="torchref-scheduler",
                                        daemon=True)
        self._thread.start()

    def post(self, fn: Any) -> None:
        self.sched.post(fn)
        self._wake.set()

    def _loop(self) -> None:
        sched = self.sched
        try:
            while not self._stop.is_set():
                worked = sched.step()
                self._snapshot = self._status()
                if not worked:
                    self._wake.wait(0.02)
                    self._wake.clear()
        except BaseException as exc:  # a dead engine: fail every request, stop stepping
            # (server.py's watch() then reports it and exits 1; the traceback goes here)
            print(f"ERROR: torch engine step loop failed:\n{format_exception(exc)}", flush=True)
            self.failure = exc
            for r in list(sched.running) + [r for q in sched.queues for r in q]:
                r.sink(("error", f"engine failure: {exc}"))
            self._snapshot = self._status()

    def status(self) -> dict[str, Any]:
        """/dtp_status. With the loop running, the snapshot its thread took after its latest
        step (at most ~20 ms old), so no other thread reads the scheduler mid-step."""
        if self._thread is not None and self._snapshot is not None:
            return self._snapshot
        return self._status()

    def _status(self) -> dict[str, Any]:
        sched = self.sched
        out = sched.status()
        engines = []
        for rank, info in enumerate(self.ready):
            res = sched.last_results.get(rank)
            engines.append({
                "rank": rank,
                "pid": info["pid"],
                "kv_pool": {
                    "data_ptr": res.pool_ptr if res else info["pool_ptr"],
                    "numel": res.pool_numel if res else info["pool_numel"],
                    "free_blocks": sched.alloc[rank].free,
                    "total_blocks": sched.alloc[rank].n_blocks,
                    "block_tokens": sched.block_tokens,
                },
                "process_groups_created": res.process_groups if res else info["process_groups"],
                "process_groups_at_start": info["process_groups"],
            })
        out["engines"] = engines
        out["process_groups_created"] = max((e["process_groups_created"] for e in engines),
                                            default=0)
        out["healthy"] = self.failure is None and all(p.poll() is None for p in self.procs)
        out["error"] = None if self.failure is None else str(self.failure)
        return out
