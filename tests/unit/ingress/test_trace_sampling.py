"""The ingress's rate-limiting trace sampler: at most `rate_per_s` new traces per second,
requests that brought a `traceparent` always traced, the rest run untraced (no trace header)."""

from __future__ import annotations

import asyncio

from llmfabric.ingress.errors import Reply
from llmfabric.ingress.tracing import TRACE_HEADER, Tracer, traced

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class _Sink:
    headers: dict[str, str] | None = None


def _run(tracer: Tracer, traceparent: str | None) -> Reply | None:
    async def call() -> Reply:
        return Reply(200, b"{}", "application/json")

    return asyncio.run(traced(tracer, traceparent, _Sink(), call))


def test_at_most_rate_traces_per_second_then_the_next_second_again() -> None:
    now = [100.0]
    tracer = Tracer(keep=50, rate_per_s=3, mono=lambda: now[0])
    got = [tracer.admit() for _ in range(5)]
    assert got == [True, True, True, False, False] and tracer.unsampled == 2
    now[0] += 0.5
    assert not tracer.admit()  # (same window)
    now[0] += 0.6
    assert [tracer.admit() for _ in range(4)] == [True, True, True, False]


def test_untraced_requests_get_no_trace_and_client_traceparents_always_do() -> None:
    now = [0.0]
    tracer = Tracer(keep=50, rate_per_s=1, mono=lambda: now[0])
    first, second = _run(tracer, None), _run(tracer, None)
    assert first is not None and TRACE_HEADER in (first.headers or {})
    assert second is not None and TRACE_HEADER not in (second.headers or {})
    parented = _run(tracer, PARENT)  # over the rate, but the client asked for a trace
    assert parented is not None and TRACE_HEADER in (parented.headers or {})
    assert tracer.recent(10)[0]["trace_id"] == PARENT.split("-")[1]
    assert len(tracer.recent(10)) == 2


def test_rate_zero_traces_only_requests_with_a_traceparent() -> None:
    tracer = Tracer(keep=10, rate_per_s=0)
    assert not tracer.admit()
    assert _run(tracer, PARENT) is not None and len(tracer.recent(10)) == 1


def test_a_client_header_bypasses_the_rate_only_if_valid_and_sampled_and_only_so_far() -> None:
    """Any `traceparent`, garbage or flagged "not sampled", skipped the sampler: one client
    had 10,000 requests a second traced and exported (the rate was 100), pushing everyone
    else's traces out of the ring."""
    clock = [0.0]
    tracer = Tracer(keep=100_000, rate_per_s=20, mono=lambda: clock[0])

    def traced_count(header: str, n: int) -> int:
        return sum(TRACE_HEADER in (_run(tracer, header).headers or {})  # type: ignore[union-attr]
                   for _ in range(n))

    unsampled = "00-" + "1" * 32 + "-" + "2" * 16 + "-00"
    for header in ("x", unsampled):
        assert traced_count(header, 300) == 20
        clock[0] += 1.0
    assert traced_count(PARENT, 600) == 200 + 20  # ten times the rate, then the rate
