"""Result numbers from hand-made outcomes, and the markdown/JSON writers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmfabric.bench import (
    SLO,
    RequestOutcome,
    RequestSpec,
    detailed,
    summarize,
    to_markdown,
    write_results,
)

SPEC = RequestSpec(0.0, "m", "the cat", 2, 10)

OUTCOMES = [
    # ttft 100 ms, latency 1 s, 10 tokens -> tpot (1 - 0.1) / 9 = 100 ms; gaps 0.1 x 9
    RequestOutcome(
        SPEC, True, ttft_s=0.1, latency_s=1.0, itls_s=(0.1,) * 9, prompt_tokens=2, output_tokens=10
    ),
    # ttft 300 ms, one token: no tpot, no itl
    RequestOutcome(SPEC, True, ttft_s=0.3, latency_s=0.5, prompt_tokens=4, output_tokens=1),
    RequestOutcome(SPEC, False, error="http_503", detail="busy"),
]


def test_summary_numbers_by_hand() -> None:
    r = summarize(OUTCOMES, duration_s=2.0, percentiles=(50, 99), slo=SLO(ttft_ms=150))
    assert (r["num_requests"], r["completed"], r["failed"]) == (3, 2, 1)
    assert (r["total_input_tokens"], r["total_output_tokens"]) == (6, 11)
    assert r["request_throughput"] == 1.0
    assert r["output_throughput"] == 5.5
    assert r["total_token_throughput"] == 8.5
    assert r["mean_ttft_ms"] == pytest.approx(200.0)
    assert r["median_ttft_ms"] == pytest.approx(200.0)
    assert r["std_ttft_ms"] == pytest.approx(100.0)
    assert r["p99_ttft_ms"] == pytest.approx(298.0)
    assert r["p50_ttft_ms"] == pytest.approx(200.0)
    assert r["mean_tpot_ms"] == pytest.approx(100.0)
    assert r["mean_itl_ms"] == pytest.approx(100.0)
    assert r["mean_e2el_ms"] == pytest.approx(750.0)
    assert r["errors_by_kind"] == {"http_503": 1}
    # only the first request meets TTFT <= 150 ms: goodput 1 / 2 s, attainment 1 of 3 sent
    assert r["request_goodput"] == 0.5
    assert r["slo_attainment"] == pytest.approx(1 / 3)


def test_slo_checks_tpot_and_e2el() -> None:
    assert SLO(tpot_ms=99).met(OUTCOMES[0]) is False
    assert SLO(tpot_ms=101, e2el_ms=1000).met(OUTCOMES[0]) is True
    assert SLO(e2el_ms=999).met(OUTCOMES[0]) is False
    assert SLO(ttft_ms=10_000).met(OUTCOMES[2]) is False
    assert summarize(OUTCOMES, duration_s=1.0)["slo_attainment"] is None


def test_detailed_and_writers(tmp_path: Path) -> None:
    d = detailed(OUTCOMES)
    assert d["output_lens"] == [10, 1, 0] and d["errors"] == ["", "", "http_503"]
    result = summarize(OUTCOMES, duration_s=2.0)
    write_results(result, tmp_path / "r.json", tmp_path / "r.md")
    assert json.loads((tmp_path / "r.json").read_text())["mean_ttft_ms"] == pytest.approx(200)
    md = (tmp_path / "r.md").read_text()
    assert md == to_markdown(result)
    assert "| Successful requests | 2 |" in md and "http_503: 1" in md
    assert "| Time to first token | 200.00 | 200.00 | 100.00 | 298.00 |" in md


def test_error_samples_say_what_the_servers_said() -> None:
    """A bounded sample of the servers' messages, not only their kinds: the first few
    distinct (kind, message) pairs with counts, each escaped and clipped (a server wrote it)."""
    from llmfabric.bench.metrics import ERROR_MESSAGE_CHARS, ERROR_SAMPLES

    def failed(kind: str, detail: str) -> RequestOutcome:
        return RequestOutcome(SPEC, False, error=kind, detail=detail)

    outcomes = [
        failed("http_401", "invalid API key"), failed("http_401", "invalid API key"),
        failed("server_error", "engine\x1b[2J died\nFAKE LOG LINE"),
        failed("http_400", "x" * 1000),
        *(failed("http_500", f"boom {i}") for i in range(10)),
        OUTCOMES[0],
    ]
    samples = summarize(outcomes, duration_s=1.0)["error_samples"]
    assert len(samples) == ERROR_SAMPLES
    assert samples[0] == {"kind": "http_401", "message": "invalid API key", "count": 2}
    assert samples[1]["message"] == "engine\\x1b[2J died\\nFAKE LOG LINE"
    assert samples[2]["message"].startswith("x" * ERROR_MESSAGE_CHARS + " ... [800 more")
    assert [s["message"] for s in samples[3:]] == ["boom 0", "boom 1"]
    md = to_markdown(summarize(outcomes, duration_s=1.0))
    assert "- http_401 x2: invalid API key" in md
    assert "\x1b" not in md and "\nFAKE LOG LINE" not in md
