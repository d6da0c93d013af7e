"""What the translated APIs cost the ingress per request and per streamed chunk (CPU only).

    python benchmarks/api_translation.py [--json OUT.json] [--requests 20000] [--chunks 256]

One process, no sockets: the translation code exactly as the ingress runs it for
`/v1/responses` and `/v1/messages` (parse the client's body, translate to chat, serialize;
parse the engine's chat reply, translate back, serialize), and the stream translators fed a
chat SSE stream of `--chunks` one-token chunks. The chat/completions/embeddings routes do
none of this (bytes are relayed unparsed), so these are the added costs of the new routes
only. Writes JSON + a markdown table (OUT.md beside OUT.json), or prints them.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).parent))
from _common import write_results

from llmfabric.apis.anthropic_api import (
    MessagesStream,
    chat_to_message,
    messages_to_chat,
)
from llmfabric.apis.responses_api import (
    ResponsesStream,
    chat_to_response,
    responses_to_chat,
)

PROMPT = "hello " * 200
RESP_BODY = orjson.dumps({"model": "m", "instructions": "be brief", "max_output_tokens": 64,
                          "input": [{"role": "user", "content": PROMPT}]})
MSG_BODY = orjson.dumps({"model": "m", "system": "be brief", "max_tokens": 64,
                         "messages": [{"role": "user", "content": PROMPT}]})
CHAT_REPLY = orjson.dumps({
    "id": "c", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "word " * 64}}],
    "usage": {"prompt_tokens": 210, "completion_tokens": 64}})


def responses_round_trip() -> bytes:
    req = orjson.loads(RESP_BODY)
    orjson.dumps(responses_to_chat(req))
    return orjson.dumps(chat_to_response(orjson.loads(CHAT_REPLY), req))


def messages_round_trip() -> bytes:
    req = orjson.loads(MSG_BODY)
    orjson.dumps(messages_to_chat(req))
    return orjson.dumps(chat_to_message(orjson.loads(CHAT_REPLY), req))


class _Null:
    async def start(self, content_type: str, node: str, model: str = "") -> None: ...

    async def write(self, data: bytes) -> None: ...

    async def end(self) -> None: ...


def per_call_us(fn: Callable[[], object], n: int, rounds: int = 5) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(times)


async def per_chunk_us(cls: type[ResponsesStream | MessagesStream], chunks: list[bytes],
                       runs: int) -> float:
    t = time.perf_counter()
    for _ in range(runs):
        s = cls(_Null(), {"model": "m"}, 1 << 20)
        await s.start("text/event-stream", "n")
        for c in chunks:
            await s.write(c)
        await s.end()
    return (time.perf_counter() - t) / runs / len(chunks) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--chunks", type=int, default=256)
    args = ap.parse_args()
    chunk = b"data: " + orjson.dumps({
        "id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"content": "tok "}, "finish_reason": None}]}
    ) + b"\n\n"
    chunks = [chunk] * args.chunks
    runs = max(1, args.requests // args.chunks)
    rows: list[dict[str, Any]] = [
        {"api": "/v1/responses", "request_round_trip_us": per_call_us(
            responses_round_trip, args.requests),
         "stream_per_chunk_us": asyncio.run(per_chunk_us(ResponsesStream, chunks, runs))},
        {"api": "/v1/messages", "request_round_trip_us": per_call_us(
            messages_round_trip, args.requests),
         "stream_per_chunk_us": asyncio.run(per_chunk_us(MessagesStream, chunks, runs))},
    ]
    write_results(args.json, {"rows": rows, "requests": args.requests,
                              "chunks": args.chunks, "python": sys.version.split()[0]},
                  "API translation cost (CPU per request / per streamed chunk)", rows,
                  notes="Request round trip: parse the client body, translate to chat, "
                        "serialize, then parse a 64-token chat reply, translate back, "
                        "serialize. Streams: one-token chat chunks re-shaped into the API's "
                        "events. Chat/completions/embeddings pay none of this.")


if __name__ == "__main__":
    main()
