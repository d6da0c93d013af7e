"""Churn and failure handling with real processes: an ingress node and six serving nodes
(`llmfabric start` + simulated engine each) on loopback, driven by the official openai SDK.

- SIGKILL two nodes under steady load: no request fails, streaming or not (a stream committed
  to a killed node continues on another); the killed nodes leave the routing candidates.
- An engine crash takes its node out of the candidates within 3 s (the issue asks for ~2 s;
  the margin is for the shared 2-core test machine), and a SIGKILLed node within 5 s.
- SIGTERM drains an in-flight stream, then the node announces LEFT and exits 0.
- A fatal engine log line (NCCL timeout) makes the node fail-stop.

The tests share one fabric and run in file order; each picks its victims among the nodes that
are still serving, and every node has its own provider id so a request can be pinned to it
with `X-Fabric-Providers`.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import openai
import pytest

from llmfabric.launch.local import EngineSpec, LocalFabric, NodeProcess
from llmfabric.testing.poll import wait_until_sync

from ._dataplane_client import forward_status

pytestmark = pytest.mark.slow

MODEL = "llama-3.1-8b"
N_NODES = 6
SPEED = 4.0  # simulated engines run 4x faster than the H100 timing model
STREAM_TOKENS = 150
CALL_TOKENS = 8
CRASH_EXCLUDE_S = 3.0  # engine crash -> out of the ingress's candidates (issue: ~2 s)
KILL_DETECT_S = 5.0  # SIGKILL -> suspected by SWIM (local preset) and out of the candidates


@dataclass(slots=True)
class Serving:
    node: NodeProcess
    session_id: str
    provider: str


@dataclass(slots=True)
class Outcome:
    stream: bool
    ok: bool
    node: str | None  # X-Fabric-Node, when the response head arrived
    chunks: int = 0
    error: str = ""


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalFabric, list[Serving]]]:
    with LocalFabric(tmp_path_factory.mktemp("churn")) as fab:
        fab.start_ingress()
        nodes = [
            fab.add_node(EngineSpec(MODEL, "H100-SXM", provider=f"p{i}", speed=SPEED))
            for i in range(N_NODES)
        ]
        fab.wait_serving({MODEL: N_NODES}, timeout=120)
        # `provider` is what X-Fabric-Providers names: on a PSK network the key fingerprint
        # (peer id), not the --provider name.
        serving = [
            Serving(n, (me := n.get_json("/v1/fabric/self"))["session_id"], me["peer_id"])
            for n in nodes
        ]
        yield fab, serving


def _client(fab: LocalFabric, timeout: float = 30.0) -> openai.OpenAI:
    assert fab.ingress is not None
    return openai.OpenAI(
        base_url=fab.ingress.http_url + "/v1",
        api_key=fab.admin_key(),
        max_retries=0,
        timeout=timeout,
    )


def _nodes(fab: LocalFabric) -> dict[str, dict[str, object]]:
    assert fab.ingress is not None
    return {n["session_id"]: n for n in fab.ingress.get_json("/v1/fabric/nodes")["nodes"]}


def _routable(fab: LocalFabric) -> set[str]:
    """Session ids the ingress would route MODEL to (SERVING and not suspected)."""
    return {
        sid
        for sid, n in _nodes(fab).items()
        if n["state"] == "SERVING"
        and not n["suspected"]
        and any(m["id"] == MODEL for m in n["models"])  # type: ignore[attr-defined]
    }


def _serving_count(fab: LocalFabric) -> int:
    return fab.serving_models().get(MODEL, 0)


def _eventually(check: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll `check` until true; returns the seconds it took."""
    return wait_until_sync(check, timeout, what, ignore=(OSError,))


def _alive(serving: list[Serving], fab: LocalFabric) -> list[Serving]:
    routable = _routable(fab)
    return [s for s in serving if s.node.alive() and s.session_id in routable]


def _sim_control(s: Serving, body: dict[str, object]) -> None:
    req = urllib.request.Request(
        f"http://127.0.0.1:{s.node.engine_port}/sim/control",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200


def _forward_direct(fab: LocalFabric, s: Serving) -> int:
    """Status of a request sent straight to the node's data plane, as an ingress would."""
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    ).encode()
    return forward_status(fab.secret, s.node.peer_addr, "/v1/chat/completions", body)


# ---- 1. churn ---------------------------------------------------------------------------


def _call(client: openai.OpenAI, i: int) -> Outcome:
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"request {i}"}],
            max_tokens=CALL_TOKENS,
        )
        reply = raw.parse()
        ok = bool(reply.choices and reply.choices[0].message.content) and (
            reply.usage is not None and reply.usage.completion_tokens == CALL_TOKENS
        )
        return Outcome(
            False, ok, raw.headers.get("x-fabric-node"), error="" if ok else "incomplete reply"
        )
    except Exception as exc:
        return Outcome(False, False, None, error=repr(exc))


def _stream(client: openai.OpenAI, i: int) -> Outcome:
    out = Outcome(True, False, None)
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"stream {i}"}],
            max_tokens=STREAM_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},  # exactly max_tokens: completeness is checkable
        )
        out.node = raw.headers.get("x-fabric-node")
        usage = None
        for chunk in raw.parse():
            out.chunks += 1
            if chunk.usage is not None:
                usage = chunk.usage
        out.ok = usage is not None and usage.completion_tokens == STREAM_TOKENS
        if not out.ok:
            out.error = f"stream ended without full usage ({out.chunks} chunks)"
    except Exception as exc:
        out.error = repr(exc)
    return out


def test_sigkill_two_nodes_under_load(fabric: tuple[LocalFabric, list[Serving]]) -> None:
    fab, serving = fabric
    duration, kill_at = 30.0, (10.0, 20.0)
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    t0 = time.monotonic()
    stop_at = t0 + duration

    def worker(kind: Callable[[openai.OpenAI, int], Outcome], wid: int) -> None:
        client = _client(fab)
        i = 0
        while time.monotonic() < stop_at:
            out = kind(client, wid * 100_000 + i)
            i += 1
            with lock:
                outcomes.append(out)
        client.close()

    workers = [threading.Thread(target=worker, args=(_call, w)) for w in range(6)]
    workers += [threading.Thread(target=worker, args=(_stream, 10 + w)) for w in range(3)]
    for w in workers:
        w.start()
    victims = [serving[1], serving[4]]
    detected: list[float] = []  # SIGKILL -> no longer a routing candidate on the ingress
    try:
        for at, victim in zip(kill_at, victims, strict=True):
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            killed_at = time.monotonic()
            victim.node.kill_hard()
            with contextlib.suppress(AssertionError):  # asserted below, after the load
                sid = victim.session_id
                _eventually(lambda: sid not in _routable(fab), KILL_DETECT_S, "")  # noqa: B023
                detected.append(time.monotonic() - killed_at)
    finally:
        for w in workers:
            w.join(timeout=duration + 60)
    assert not any(w.is_alive() for w in workers)

    calls = [o for o in outcomes if not o.stream]
    streams = [o for o in outcomes if o.stream]
    failed_calls = [o for o in calls if not o.ok]
    failed_streams = [o for o in streams if not o.ok]
    killed = {v.session_id for v in victims}
    assert fab.ingress is not None
    continued = fab.ingress.log_path.read_text(errors="replace").count("continued on node")
    print(
        f"\nchurn: {continued} stream(s) continued after a kill; "
        f"{len(calls)} non-streaming ({len(failed_calls)} failed), "
        f"{len(streams)} streams ({len(failed_streams)} failed: "
        f"{[(o.node, o.chunks, o.error[:80]) for o in failed_streams[:10]]}); "
        f"SIGKILL -> excluded in {[round(d, 2) for d in detected]} s"
    )
    assert len(calls) > 100 and len(streams) > 10, "the load did not run"
    # Each SIGKILLed node left the ingress's routing candidates (suspected) within the bound.
    assert len(detected) == len(victims), f"not excluded within {KILL_DETECT_S} s: {detected}"
    assert failed_calls == [], [o.error for o in failed_calls[:5]]
    # Streams committed to a killed node continue on another (ingress/continuation.py).
    assert failed_streams == [], [(o.node in killed, o.chunks, o.error[:80])
                                  for o in failed_streams[:5]]
    # Requests were spread: every node served some before or after the kills.
    served = {o.node for o in outcomes if o.ok}
    assert {s.session_id for s in serving} <= served

    # The killed nodes are no longer routing candidates on the ingress replica.
    def excluded() -> bool:
        nodes = _nodes(fab)
        return all(
            sid not in nodes or nodes[sid]["suspected"] or nodes[sid]["state"] in ("DOWN", "LEFT")
            for sid in killed
        )

    _eventually(excluded, 15, "the killed nodes are suspected or gone on the ingress")
    assert killed.isdisjoint(_routable(fab))
    assert _serving_count(fab) == N_NODES - len(killed)
    # ... and the OpenAI catalog the SDK sees no longer lists them as providers of the model.
    [entry] = [m for m in _client(fab).models.list() if m.id == MODEL]
    listed = set((entry.model_extra or {}).get("nodes", []))
    assert listed == {s.session_id for s in serving} - killed


# ---- 2. engine crash --------------------------------------------------------------------


def test_engine_crash_excludes_the_node(fabric: tuple[LocalFabric, list[Serving]]) -> None:
    fab, serving = fabric
    alive = _alive(serving, fab)
    assert len(alive) >= 2
    victim = alive[0]
    before = _serving_count(fab)
    t0 = time.monotonic()
    _sim_control(victim, {"action": "crash"})

    def gone() -> bool:
        return victim.session_id not in _routable(fab) and _serving_count(fab) == before - 1

    _eventually(gone, CRASH_EXCLUDE_S, "the node with the crashed engine is excluded")
    elapsed = time.monotonic() - t0
    print(f"\nengine crash -> excluded on the ingress in {elapsed:.3f} s")
    state = _nodes(fab)[victim.session_id]["state"]
    assert state == "DOWN", state
    assert victim.node.alive(), "the node itself keeps running (DOWN, not gone)"
    # Requests for the model keep being served by the others, never by the victim.
    client = _client(fab)
    for i in range(5):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"after crash {i}"}],
            max_tokens=2,
        )
        assert raw.headers.get("x-fabric-node") != victim.session_id
    with pytest.raises(openai.APIStatusError) as err:  # pinned to the victim: no candidate
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            max_tokens=2,
            extra_headers={"X-Fabric-Providers": victim.provider},
        )
    assert err.value.status_code == 503


# ---- 3. graceful leave ------------------------------------------------------------------


def test_sigterm_drains_a_stream_then_leaves(fabric: tuple[LocalFabric, list[Serving]]) -> None:
    fab, serving = fabric
    alive = _alive(serving, fab)
    assert len(alive) >= 2
    victim = alive[0]
    tokens = 600  # > 1 s at this speed: the SIGTERM lands mid-stream
    client = _client(fab)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "a long answer"}],
        max_tokens=tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"X-Fabric-Providers": victim.provider},
        extra_body={"ignore_eos": True},
    )
    assert raw.headers.get("x-fabric-node") == victim.session_id
    it = iter(raw.parse())
    first = [next(it) for _ in range(3)]
    assert _forward_direct(fab, victim) == 200  # the route an ingress forwards to takes work
    victim.node.signal(signal.SIGTERM)
    # Draining: the node announces DOWN and refuses new forwarded work (503, which an ingress
    # that has not seen DOWN yet retries elsewhere) while the stream goes on.
    _eventually(
        lambda: victim.node.get_json("/healthz")["state"] != "SERVING", 5, "the node drains"
    )
    assert _forward_direct(fab, victim) == 503
    for i in range(3):
        other = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": f"during drain {i}"}], max_tokens=2
        )
        assert other.headers.get("x-fabric-node") != victim.session_id
    rest = list(it)
    assert rest, "the stream was still in flight when SIGTERM arrived"
    chunks = first + rest
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == tokens
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)

    # Default drain/engine-stop timeouts: the node is gone within Slurm's KillWait (30 s).
    code = victim.node.proc.wait(timeout=30)
    assert code == 0, fab.tail(victim.node)
    _eventually(
        lambda: _nodes(fab).get(victim.session_id, {}).get("state") == "LEFT",
        10,
        "the ingress sees the node LEFT",
    )
    assert victim.session_id not in _routable(fab)


# ---- 4. fatal log line ------------------------------------------------------------------


def test_fatal_engine_log_line_fail_stops_the_node(
    fabric: tuple[LocalFabric, list[Serving]],
) -> None:
    fab, serving = fabric
    alive = _alive(serving, fab)
    assert len(alive) >= 2
    victim = alive[0]
    line = (
        "[rank0]:[E ProcessGroupNCCL.cpp:563] [Rank 0] NCCL watchdog timeout: "
        "WorkNCCL(SeqNum=42, OpType=ALLREDUCE) ran for 600000 milliseconds"
    )
    t0 = time.monotonic()
    _sim_control(victim, {"action": "log", "line": line})
    code = victim.node.proc.wait(timeout=15)
    print(f"\nfatal log line -> node exited ({code}) in {time.monotonic() - t0:.3f} s")
    assert code > 0, fab.tail(victim.node)  # it exited by itself, with an error status

    def gone() -> bool:
        node = _nodes(fab).get(victim.session_id)
        return node is None or node["state"] in ("DOWN", "LEFT")

    _eventually(gone, 10, "the fail-stopped node leaves the candidate set")
    assert victim.session_id not in _routable(fab)
    # Fail-stop also stops the engine: its port no longer answers.
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{victim.node.engine_port}/health", timeout=2)
