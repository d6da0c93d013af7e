"""What each request of a load run asks for: arrival offset, model, prompt, output length.

Synthetic prompts: the bench has no tokenizer, so a prompt of N tokens is N common three-letter
English words separated by spaces (" the", " and", ...). Each such word is one token in
BPE tokenizers (GPT, Llama, Qwen), and the text is 4N-1 characters, which also gives N under
the 4-characters-per-token rule the simulated engine uses. Words are drawn at random, so
prompts share no prefix; `prompt_from_hash_ids` instead builds a prompt whose blocks are
determined by a trace's hash ids, so replaying a Mooncake / OpenTela trace reproduces its
prefix sharing.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from llmfabric.bench.arrivals import ArrivalProcess, Replay
from llmfabric.bench.errors import BenchConfigError
from llmfabric.traces.schema import HashId, TraceRecord

_WORDS_TEXT = """the and for are but not you all any can had her was one our out day get has him
    his how man new now old see two way who boy did its let put say she too use dog cat run big
    red sun sea sky car bus key map pen box cup hat top end art job law war age air arm bed bit"""
WORDS: tuple[str, ...] = tuple(_WORDS_TEXT.split())


@dataclass(frozen=True, slots=True)
class RequestSpec:
    offset_s: float
    model: str
    prompt: str
    input_len: int
    output_len: int


def synthetic_prompt(n_tokens: int, rng: random.Random) -> str:
    """A prompt of about `n_tokens` tokens (see the module docstring)."""
    return " ".join(rng.choice(WORDS) for _ in range(max(1, n_tokens)))


def prompt_from_hash_ids(hash_ids: Sequence[HashId], block_tokens: int, n_tokens: int) -> str:
    """A prompt whose i-th block of `block_tokens` words depends only on hash id i."""
    words: list[str] = []
    for hid in hash_ids:
        block_rng = random.Random(f"block:{hid}")
        words.extend(block_rng.choice(WORDS) for _ in range(block_tokens))
        if len(words) >= n_tokens:
            break
    if len(words) < n_tokens:
        filler = random.Random(f"fill:{tuple(hash_ids)}:{n_tokens}")
        words.extend(filler.choice(WORDS) for _ in range(n_tokens - len(words)))
    return " ".join(words[: max(1, n_tokens)])


def _length(rng: random.Random, mean: int, range_ratio: float) -> int:
    """Uniform in [mean * (1 - r), mean * (1 + r)] (vllm's --random-range-ratio), at least 1."""
    lo = max(1, round(mean * (1 - range_ratio)))
    hi = max(lo, round(mean * (1 + range_ratio)))
    return rng.randint(lo, hi)


def synthetic_workload(
    arrival: ArrivalProcess,
    *,
    model: str,
    input_len: int,
    output_len: int,
    range_ratio: float = 0.0,
    max_requests: int,
    max_duration_s: float,
    seed: int = 0,
) -> list[RequestSpec]:
    """Requests at the arrival process's offsets with random prompts of the requested lengths."""
    if input_len < 1 or output_len < 1:
        raise BenchConfigError("input and output lengths must be at least 1 token")
    if not 0 <= range_ratio < 1:
        raise BenchConfigError("range_ratio must be in [0, 1)")
    rng = random.Random(seed)
    offsets = arrival.offsets(random.Random(seed + 1), max_requests, max_duration_s)
    specs = []
    for offset in offsets:
        n_in = _length(rng, input_len, range_ratio)
        specs.append(
            RequestSpec(
                offset,
                model,
                synthetic_prompt(n_in, rng),
                n_in,
                _length(rng, output_len, range_ratio),
            )
        )
    return specs


def replay_workload(
    records: Sequence[TraceRecord],
    *,
    time_scale: float = 1.0,
    max_requests: int,
    max_duration_s: float,
    model: str | None = None,
    max_input_len: int | None = None,
    max_output_len: int | None = None,
    seed: int = 0,
) -> list[RequestSpec]:
    """Replay a trace: its arrival times scaled by `time_scale`, its lengths, its prefixes.

    `model` sends every request to one model (traces name models the fabric may not serve);
    `max_input_len` / `max_output_len` clip lengths to what the served model accepts.
    """
    ordered = sorted(records, key=lambda r: r.timestamp)
    offsets = Replay([r.timestamp for r in ordered], time_scale).offsets(
        random.Random(seed), max_requests, max_duration_s
    )
    rng = random.Random(seed)
    specs = []
    for rec, offset in zip(ordered, offsets, strict=False):
        n_in = max(1, rec.input_tokens)
        if max_input_len is not None:
            n_in = min(n_in, max_input_len)
        n_out = max(1, rec.output_tokens)
        if max_output_len is not None:
            n_out = min(n_out, max_output_len)
        if rec.hash_ids:
            prompt = prompt_from_hash_ids(rec.hash_ids, rec.block_tokens, n_in)
        else:
            prompt = synthetic_prompt(n_in, rng)
        specs.append(RequestSpec(offset, model or rec.model, prompt, n_in, n_out))
    return specs
