"""The ingress's own anonymized trace: finished requests -> traces.TraceRecorder rows.

Only counts, sampling parameters and salted, irreversible hashes of 16-token input buckets
are written (docs/traces.md); never prompt or completion text. Keys created with
record_trace=False opt out.
"""

from __future__ import annotations

import os
import pathlib
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from llmfabric.ingress.config import TraceEvent
from llmfabric.traces import TraceRecorder

TRACED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


def load_or_create_salt(path: pathlib.Path) -> bytes:
    """A per-ingress secret salt (0600): hashes stay comparable across restarts."""
    if path.exists():
        return bytes.fromhex(path.read_text().strip())
    salt = secrets.token_bytes(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(salt.hex())
    return salt


class IngressTraceHook:
    def __init__(self, recorder: TraceRecorder) -> None:
        self.recorder = recorder

    def __call__(self, event: TraceEvent) -> None:
        if event.opted_out or event.path not in TRACED_PATHS or event.node is None:
            return
        doc: Mapping[str, Any] = event.request or {}
        messages = doc.get("messages")
        prompt = doc.get("prompt")
        self.recorder.record(
            event.model,
            messages=messages if isinstance(messages, list) else None,
            prompt=prompt if isinstance(prompt, str) or _str_list(prompt) else None,
            input_tokens=event.prompt_tokens,
            output_tokens=event.completion_tokens or 0,
            sampling_params=doc,
            latency_s=event.e2e_s,
            timestamp=event.started_at,
        )

    def close(self) -> None:
        self.recorder.close()


def _str_list(value: object) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str) and all(
        isinstance(v, str) for v in value
    )
