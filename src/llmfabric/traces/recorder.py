"""Record the ingress's own anonymized trace: one JSONL row per request, in the trace schema.

Never stores prompt or completion text. The input is cut into approximate tokens (the ingress
has no tokenizer), the tokens are grouped in buckets of 16, and each bucket becomes a salted,
chained, irreversible hash:

- approximate tokenizer (`approx_tokens`): the regex `\\s*\\w+|\\s*[^\\w\\s]`, i.e. a run of word
  characters or one punctuation character, each with the whitespace before it. This is close
  to (within a small factor of) BPE token counts for English text and is deterministic, so two
  requests that share a text prefix share their leading buckets;
- chat messages are flattened as `<|role|>\\ncontent\\n` per message (content parts of type
  "text" are concatenated; other parts contribute their type only);
- bucket hash: `h_i = HMAC-SHA256(salt, h_{i-1} || tokens_i joined by U+001F)`, truncated to 64
  bits and written as 16 hex digits. Chaining (as Mooncake does) makes equal ids mean equal
  prefixes, which is what a prefix cache can reuse. The salt is secret to the operator: without
  it, ids cannot be matched against guessed texts. The last, partial bucket is hashed too.

The caller decides what to record (the ingress skips keys that opted out); `record` is cheap
(one small synchronous append) and `aclose`/`close` flush and close the file.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import orjson

from llmfabric.clock import Clock, SystemClock
from llmfabric.traces.errors import TraceError
from llmfabric.traces.schema import DEFAULT_BLOCK_TOKENS, JSONScalar, TraceRecord

_TOKEN_RE = re.compile(r"\s*\w+|\s*[^\w\s]")
_SEP = "\x1f"

# Sampling parameters worth keeping (never free text such as `stop` sequences or `user`).
RECORDED_SAMPLING_KEYS: tuple[str, ...] = (
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "max_completion_tokens",
    "min_tokens",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "n",
    "stream",
    "seed",
)


def approx_tokens(text: str) -> list[str]:
    """Split text into approximate tokens (see the module docstring)."""
    return _TOKEN_RE.findall(text)


def flatten_messages(messages: Sequence[Mapping[str, Any]]) -> str:
    """One deterministic text for a list of OpenAI chat messages."""
    parts: list[str] = []
    for message in messages:
        role = str(message.get("role", ""))
        content = message.get("content")
        if isinstance(content, str):
            text = content
        elif isinstance(content, list):
            pieces: list[str] = []
            for part in content:
                if isinstance(part, Mapping):
                    if part.get("type") == "text":
                        pieces.append(str(part.get("text", "")))
                    else:
                        pieces.append(f"<{part.get('type', 'part')}>")
            text = "".join(pieces)
        else:
            text = ""
        parts.append(f"<|{role}|>\n{text}\n")
    return "".join(parts)


def bucket_hashes(
    tokens: Sequence[str], salt: bytes, block_tokens: int = DEFAULT_BLOCK_TOKENS
) -> tuple[str, ...]:
    """Salted chained hashes of consecutive `block_tokens`-token buckets (last one may be short)."""
    if block_tokens < 1:
        raise ValueError("block_tokens must be at least 1")
    out: list[str] = []
    previous = b""
    for start in range(0, len(tokens), block_tokens):
        chunk = _SEP.join(tokens[start : start + block_tokens]).encode("utf-8")
        digest = hmac.new(salt, previous + chunk, hashlib.sha256).digest()
        previous = digest
        out.append(digest[:8].hex())
    return tuple(out)


def sampling_subset(params: Mapping[str, Any]) -> dict[str, JSONScalar]:
    """Keep only the numeric/boolean sampling parameters listed in RECORDED_SAMPLING_KEYS."""
    kept: dict[str, JSONScalar] = {}
    for key in RECORDED_SAMPLING_KEYS:
        value = params.get(key)
        if isinstance(value, bool | int | float):
            kept[key] = value
    return kept


class TraceRecorder:
    """Append anonymized TraceRecords to a JSONL file (llmfabric trace schema)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        salt: bytes,
        *,
        clock: Clock | None = None,
        block_tokens: int = DEFAULT_BLOCK_TOKENS,
    ) -> None:
        if len(salt) < 16:
            raise TraceError(
                "the trace salt must be at least 16 random bytes (e.g. os.urandom(32)); keep it "
                "secret and stable across restarts so hashes stay comparable"
            )
        self.path = Path(path)
        self._salt = salt
        self._clock: Clock = clock or SystemClock()
        self._block_tokens = block_tokens
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[bytes] | None = self.path.open("ab")

    def make_record(
        self,
        model: str,
        *,
        prompt: str | Iterable[str] | None = None,
        messages: Sequence[Mapping[str, Any]] | None = None,
        input_tokens: int | None = None,
        output_tokens: int = 0,
        sampling_params: Mapping[str, Any] | None = None,
        latency_s: float | None = None,
        timestamp: float | None = None,
    ) -> TraceRecord:
        """The record `record` would write (no I/O). Text is hashed, then dropped."""
        if messages is not None:
            text = flatten_messages(messages)
        elif isinstance(prompt, str):
            text = prompt
        elif prompt is not None:
            text = "\n".join(prompt)
        else:
            text = ""
        tokens = approx_tokens(text)
        hashes = bucket_hashes(tokens, self._salt, self._block_tokens) if tokens else ()
        return TraceRecord(
            timestamp=self._clock.wall() if timestamp is None else timestamp,
            model=model,
            input_tokens=len(tokens) if input_tokens is None else int(input_tokens),
            output_tokens=int(output_tokens),
            sampling_params=sampling_subset(sampling_params or {}),
            hash_ids=hashes,
            block_tokens=self._block_tokens,
            latency_s=latency_s,
        )

    def record(
        self,
        model: str,
        *,
        prompt: str | Iterable[str] | None = None,
        messages: Sequence[Mapping[str, Any]] | None = None,
        input_tokens: int | None = None,
        output_tokens: int = 0,
        sampling_params: Mapping[str, Any] | None = None,
        latency_s: float | None = None,
        timestamp: float | None = None,
    ) -> TraceRecord:
        """Append one request to the trace and return the record written.

        `input_tokens`: the engine-reported count when known (else the approximate count);
        `latency_s`: end-to-end latency; `timestamp`: arrival (Unix seconds; default now).
        """
        rec = self.make_record(
            model,
            prompt=prompt,
            messages=messages,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            sampling_params=sampling_params,
            latency_s=latency_s,
            timestamp=timestamp,
        )
        self.write(rec)
        return rec

    def write(self, rec: TraceRecord) -> None:
        if self._fh is None:
            raise TraceError(f"trace recorder for {self.path} is closed; create a new one")
        self._fh.write(orjson.dumps(rec.to_row()) + b"\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    async def aclose(self) -> None:
        self.close()
