"""Counting tokens with the engine's own tokenizer (its `/tokenize` route).

Used by the node for streams whose engine reports no usage (forward/stream_usage.py). Each
adapter names its route and body shape (agent/engines.py `tokenize_format`):

- vllm:             POST /tokenize {"model", "prompt"} or {"model", "messages",
                    "add_generation_prompt": true} (its chat template applied) -> {"count"}
- llama.cpp:        POST /tokenize {"content", "add_special": true} -> {"tokens": [...]}
- llama-cpp-python: POST /extras/tokenize/count {"input"} -> {"count"}
- tgi:              POST /tokenize {"inputs"} -> [{"id", ...}, ...]

Bounded: texts over `max_chars` are not sent, a call has `timeout_s`, an answer over
`max_answer` bytes is not read. Any failure (refused, slow, malformed) returns None and the
caller falls back to its documented estimate; the engine's answer is clamped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
import orjson

from llmfabric.agent.engines import EngineKind, engine_phrase
from llmfabric.agent.probe import read_capped

MAX_COUNT = 10_000_000  # a tokenizer's count above this is not believed


class EngineTokenizer:
    def __init__(
        self,
        kind: EngineKind,
        base_url: str,
        session: Callable[[], aiohttp.ClientSession],
        *,
        timeout_s: float = 2.0,
        max_chars: int = 1_000_000,
        max_answer: int = 16 * 1024 * 1024,
    ) -> None:
        if kind.tokenize_path is None:
            raise ValueError(f"{engine_phrase(kind.name)} has no tokenize route")
        self.kind = kind
        self._url = base_url.rstrip("/") + kind.tokenize_path
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.max_chars = max_chars
        self._max_answer = max_answer
        self.failures = 0  # calls that fell back (metrics, tests)

    @property
    def applies_chat_template(self) -> bool:
        """True when `count_messages` counts the engine's rendered chat prompt exactly."""
        return self.kind.tokenize_format == "vllm"

    async def count(self, text: str, model: str) -> int | None:
        """Tokens of `text` as the engine tokenizes a prompt (special tokens such as BOS
        added the way its completions route adds them); None when unknown."""
        if len(text) > self.max_chars:
            return None
        fmt = self.kind.tokenize_format
        body: dict[str, Any]
        if fmt == "vllm":
            body = {"model": model, "prompt": text}
        elif fmt == "llama.cpp":
            body = {"content": text, "add_special": True}
        elif fmt == "llama-cpp-python":
            body = {"input": text, "model": model}
        elif fmt == "tgi":
            body = {"inputs": text}
        else:
            return None
        return await self._post(body)

    async def count_messages(self, messages: Sequence[Any], model: str) -> int | None:
        """vLLM only: the prompt its chat template renders from `messages`, counted."""
        if not self.applies_chat_template:
            return None
        return await self._post({"model": model, "messages": list(messages),
                                 "add_generation_prompt": True})

    async def _post(self, body: dict[str, Any]) -> int | None:
        try:
            async with self._session().post(
                self._url, data=orjson.dumps(body), timeout=self._timeout,
                headers={"Content-Type": "application/json"},
            ) as resp:
                if resp.status != 200:
                    raise ValueError(f"status {resp.status}")
                raw = await read_capped(resp, self._max_answer)
                if raw is None:
                    raise ValueError("answer too large")
                n = token_count(orjson.loads(raw))
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            n = None
        if n is None:
            self.failures += 1
        return n


def token_count(doc: Any) -> int | None:
    """The count in a tokenize answer of any supported shape; None when it has none."""
    if isinstance(doc, dict):
        n = doc.get("count")
        if isinstance(n, int) and not isinstance(n, bool):
            return n if 0 <= n <= MAX_COUNT else None
        doc = doc.get("tokens")
    if isinstance(doc, list):
        return len(doc) if len(doc) <= MAX_COUNT else None
    return None
