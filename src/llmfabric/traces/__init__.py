"""Trace schema, loaders, workload characterization and plots (OpenTela §6).

Files -> concepts:
- `schema.py`: `TraceRecord` (timestamp s, model, input_tokens, output_tokens, sampling_params,
  hash_ids per `block_tokens`-token bucket, latency_s), `is_reasoning_model(name)`.
- `formats.py`: row adapters per format (`llmfabric`/`swissai`, `burstgpt`, `azure2023`,
  `azure2024`, `mooncake`) and format detection from column names.
- `load.py`: `iter_batches(path, fmt="auto", *, model=None, chunk_rows=65536, progress=None)`
  and `iter_records(...)`: chunked reading of CSV (pyarrow streaming), Parquet (row batches)
  and JSONL (line by line); `detect_format(path)`.
- `recorder.py`: `TraceRecorder`, the ingress's anonymized trace writer (below).
- `analysis.py`: `TraceAnalyzer` (streaming accumulator) -> `Characterization`; the definitions
  of tiers, burstiness, percentiles, output ratio, prefix reuse, latency split.
- `plots.py`: one matplotlib (Agg) PNG per figure.
- `report.py`: `analyze_trace(path, out_dir, ...)` writes summary.json, per-figure JSON + PNG
  and report.md (the `llmfabric trace analyze` command).
- `errors.py`: `TraceError` > `TraceFormatError`, `UnknownTraceFormatError`.

Recording at the ingress::

    from llmfabric.traces import TraceRecorder
    recorder = TraceRecorder("traces/ingress.jsonl", salt=secret_32_bytes, clock=clock)
    recorder.record(
        "llama-3-8b",
        messages=body["messages"],          # or prompt="..." for /v1/completions
        input_tokens=usage.prompt_tokens,   # engine's count; None -> approximate count
        output_tokens=usage.completion_tokens,
        sampling_params=body,               # only numeric knobs are kept (temperature, ...)
        latency_s=end - start,
    )
    await recorder.aclose()

The text is cut into approximate tokens by a regex (a word or one punctuation mark with its
leading whitespace; the ingress has no tokenizer), grouped in buckets of 16, and every bucket
becomes a chained HMAC-SHA256 under the operator's secret salt (64 bits, hex). No prompt or
completion text is stored. Opt-out is the caller's decision: the ingress does not call
`record` for keys that opted out.
"""

from llmfabric.traces.errors import TraceError, TraceFormatError, UnknownTraceFormatError
from llmfabric.traces.load import detect_format, iter_batches, iter_records
from llmfabric.traces.recorder import TraceRecorder, approx_tokens, bucket_hashes
from llmfabric.traces.schema import TraceRecord, is_reasoning_model

__all__ = [
    "TraceError",
    "TraceFormatError",
    "TraceRecord",
    "TraceRecorder",
    "UnknownTraceFormatError",
    "approx_tokens",
    "bucket_hashes",
    "detect_format",
    "is_reasoning_model",
    "iter_batches",
    "iter_records",
]
