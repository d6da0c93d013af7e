"""Deterministic text for the simulated engine: pseudo-word tokens, token counts, embeddings.

Tokens: one pseudo-word per token (" lorem", " fabric", ...), chosen by a seed derived from the
prompt, so the same prompt always yields the same completion. Prompt tokens are counted
approximately as ceil(characters / 4) (OpenAI's rule of thumb for English), at least 1, plus
4 per chat message for the role/template overhead, as tiktoken-based counters do.
Natural completion length (when max_tokens allows it) is 16 to 79 tokens, from the seed.
`block_ids` names a prompt's 16-token blocks for the engine's prefix cache.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

_WORDS_TEXT = """lorem ipsum dolor sit amet fabric node token gpu cluster route model serve stream
    batch cache prefix decode prefill kernel tensor layer weight graph query value shard
    replica gossip peer relay ingress quorum vector scalar matrix sample logit softmax
    attention context window memory bandwidth latency throughput queue worker engine
    signal packet frame epoch season river mountain forest harbor lantern meadow"""
WORDS: tuple[str, ...] = tuple(_WORDS_TEXT.split())
CHARS_PER_TOKEN = 4
CHAT_MESSAGE_OVERHEAD = 4


def seed_of(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


# The prefix cache's block: 16 tokens (vLLM's default block size) of ~4 characters each.
BLOCK_TOKENS = 16
BLOCK_CHARS = BLOCK_TOKENS * CHARS_PER_TOKEN


def block_ids(text: str) -> list[int]:
    """Chain ids of the text's whole blocks (id i names blocks 0..i), as prefix caches key
    KV blocks: two prompts share leading ids exactly as far as they share leading blocks."""
    data = text.encode()
    ids: list[int] = []
    prev = b""
    for i in range(len(data) // BLOCK_CHARS):
        prev = hashlib.blake2b(prev + data[i * BLOCK_CHARS:(i + 1) * BLOCK_CHARS],
                               digest_size=8).digest()
        ids.append(int.from_bytes(prev, "big"))
    return ids


def count_tokens(text: str) -> int:
    return max(1, -(-len(text) // CHARS_PER_TOKEN))


def token_text(seed: int, index: int) -> str:
    word = WORDS[(seed + index * 7919 + (seed >> (index % 13))) % len(WORDS)]
    return word if index == 0 else " " + word


def natural_length(seed: int) -> int:
    return 16 + seed % 64


def embedding(text: str, dims: int) -> list[float]:
    """A unit vector determined by `text` (same text, same vector)."""
    rng = np.random.default_rng(seed_of(text))
    v = rng.standard_normal(dims)
    v /= np.linalg.norm(v) or 1.0
    return [float(x) for x in v]


_WORD_SET = frozenset(WORDS)
_LONGEST_WORD = max(map(len, WORDS))


def continued_prompt(prompt: str, max_tokens: int = 1024) -> tuple[str, int]:
    """A completions prompt that ends with this engine's own output for an earlier prompt
    (what a continuation sends: prompt + relayed text): (the earlier prompt, tokens already
    generated), so the engine goes on as a language model would; else (prompt, 0).

    Cost: the prompt's tail is split (not the whole prompt), and the head is hashed only when
    some split is a candidate, then one hash copy per candidate (the trailing run of
    pseudo-words, at most `max_tokens`); the longest matching tail wins."""
    limit = 64
    while True:
        parts = prompt.rsplit(" ", limit)  # parts[0] is the rest when the split was cut
        run = 0  # trailing chunks that are whole words: candidates for tokens 1..k-1
        while run < min(len(parts) - 1, max_tokens - 1) and parts[-1 - run] in _WORD_SET:
            run += 1
        if run < len(parts) - 1 or len(parts) <= limit or limit >= max_tokens:
            break
        limit *= 4
    first = len(parts) - 1 - run
    pos = sum(map(len, parts[:first])) + first  # where chunk `first` starts
    h: Any = None
    for j in range(first, len(parts)):  # token 0 glued to the end of chunk j; k descending
        chunk, k = parts[j], len(parts) - j
        for n in range(1, min(len(chunk), _LONGEST_WORD) + 1):
            if chunk[-n:] not in _WORD_SET:
                continue
            if h is None:
                h = hashlib.sha256(prompt[:pos].encode())
            c = h.copy()
            c.update(chunk[:-n].encode())
            seed = int.from_bytes(c.digest()[:8], "big")
            if token_text(seed, 0) == chunk[-n:] and all(
                    token_text(seed, i) == " " + parts[j + i] for i in range(1, k)):
                return prompt[:pos + len(chunk) - n], k
        if h is not None:
            h.update((chunk + " ").encode())
        pos += len(chunk) + 1
    return prompt, 0
