"""Engine load from metrics text captured in the engines' formats (written here)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.agent.engine_metrics import (
    EngineLoad,
    PrefixRate,
    load_from_metrics,
    load_from_slots,
    parse_prometheus,
)

pytestmark = pytest.mark.unit

VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 5.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.4375
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 250.0
vllm:request_success_total{finished_reason="stop",model_name="tiny"} 12.0
"""
VLLM_OLD = """vllm:num_requests_running{model_name="m"} 1
vllm:num_requests_waiting{model_name="m"} 0
vllm:gpu_cache_usage_perc{model_name="m"} 0.9
vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.5
"""
SGLANG = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen",tp_rank="0"} 7.0
sglang:num_queue_reqs{model_name="qwen",tp_rank="0"} 2.0
sglang:token_usage{model_name="qwen",tp_rank="0"} 0.61
sglang:cache_hit_rate{model_name="qwen",tp_rank="0"} 0.33
"""
LLAMACPP = """# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.125
llamacpp:requests_processing 2
llamacpp:requests_deferred 4
llamacpp:prompt_tokens_total 90
"""
TGI = "tgi_queue_size 3\ntgi_batch_current_size 8\n"


def test_each_engine_format() -> None:
    v = load_from_metrics("vllm", VLLM)
    assert v is not None and (v.running, v.waiting, v.kv_usage) == (3, 5, 0.4375)
    assert (v.prefix_hits, v.prefix_queries, v.prefix_hit_rate) == (250.0, 1000.0, None)
    old = load_from_metrics("vllm", VLLM_OLD)
    assert old == EngineLoad(1, 0, 0.9, 0.5)
    assert load_from_metrics("sglang", SGLANG) == EngineLoad(7, 2, 0.61, 0.33)
    assert load_from_metrics("llama.cpp", LLAMACPP) == EngineLoad(2, 4, 0.125)
    assert load_from_metrics("tgi", TGI) == EngineLoad(8, 3)
    # another engine's text tells this one nothing
    assert load_from_metrics("vllm", SGLANG) is None
    assert load_from_metrics("llama.cpp", "") is None


def test_hostile_values_are_clamped_or_skipped() -> None:
    text = ('vllm:num_requests_running{a="}"} -4\nvllm:num_requests_waiting NaN\n'
            'vllm:kv_cache_usage_perc 7.5\ngarbage\n{only="labels"} 3\nx{ 1\n')
    got = load_from_metrics("vllm", text)
    assert got == EngineLoad(0, 0, 1.0)
    # each sample finite, their sum not: round(inf) raised, and the load loop logged a
    # traceback every round with its load hints lost
    huge = 'vllm:num_requests_running{a="1"} 1e308\nvllm:num_requests_running{a="2"} 1e308\n'
    assert load_from_metrics("vllm", huge) == EngineLoad(0, 0, 0.0)


def test_prefix_rate_from_counters() -> None:
    rate = PrefixRate()
    first = EngineLoad(prefix_hits=25.0, prefix_queries=100.0)
    assert rate.update(first) == 0.25  # lifetime rate on the first scrape
    assert rate.update(EngineLoad(prefix_hits=125.0, prefix_queries=200.0)) == 1.0  # recent
    assert rate.update(EngineLoad(prefix_hits=125.0, prefix_queries=200.0)) is None  # idle
    assert rate.update(EngineLoad(prefix_hits=1.0, prefix_queries=4.0)) == 0.25  # restarted
    assert rate.update(EngineLoad(prefix_hit_rate=0.7)) == 0.7


def test_llama_server_slots() -> None:
    slots = [{"id": 0, "is_processing": True}, {"id": 1, "is_processing": False},
             {"id": 2, "state": 1}, "junk"]
    assert load_from_slots(slots) == EngineLoad(running=2)
    assert load_from_slots({"error": "slots disabled"}) is None


@given(st.text(max_size=400))
def test_parser_never_raises(text: str) -> None:
    parsed = parse_prometheus(text)
    assert all(v == v for v in parsed.values())
    for fmt in ("vllm", "sglang", "llama.cpp", "tgi"):
        got = load_from_metrics(fmt, text)
        assert got is None or (got.running >= 0 and 0.0 <= got.kv_usage <= 1.0)


def test_data_parallel_engines_add_requests_and_average_ratios() -> None:
    text = ('vllm:num_requests_running{engine="0"} 2\nvllm:num_requests_running{engine="1"} 3\n'
            'vllm:num_requests_waiting{engine="0"} 1\nvllm:num_requests_waiting{engine="1"} 0\n'
            'vllm:kv_cache_usage_perc{engine="0"} 0.8\nvllm:kv_cache_usage_perc{engine="1"} 0.4\n')
    got = load_from_metrics("vllm", text)
    assert got is not None and (got.running, got.waiting) == (5, 1)
    assert abs(got.kv_usage - 0.6) < 1e-9  # the mean, not a clamped sum of 1.2
