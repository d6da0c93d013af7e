"""Where an engine publishes its KV-cache events: vLLM's `--kv-events-config` JSON.

`{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
"topic": "kv"}` (vLLM's defaults: endpoint `tcp://*:5557`, topic ""; `publisher` defaults to
"zmq" when events are enabled). As in vLLM, the publisher BINDS an endpoint with a wildcard
host (`*`, `::`) or an ipc:// / inproc:// one and CONNECTS to any other, so the subscriber
does the opposite: it connects to 127.0.0.1 for a wildcard, and binds e.g.
`tcp://127.0.0.1:5557` itself. The latter is the safer choice: the events carry the prompts'
token ids, and a wildcard bind offers them to the whole network.

`llmfabric engine sim --kv-events-config` takes the same JSON, and the node finds it in the
engine command (`from_argv`) or takes it from its own `--kv-events-config` (an engine whose
command does not show the flag: a wrapper script, a config file).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

FLAG = "--kv-events-config"
DEFAULT_ENDPOINT = "tcp://*:5557"
MAX_CONFIG_CHARS = 4096


class KvEventsConfigError(ValueError):
    """A --kv-events-config value that cannot be used."""


@dataclass(frozen=True, slots=True)
class KvEventsEndpoint:
    endpoint: str  # as the publisher names it
    topic: str = ""

    @property
    def publisher_binds(self) -> bool:
        e = self.endpoint
        return "*" in e or "::" in e or e.startswith(("ipc://", "inproc://"))

    @property
    def subscriber_endpoint(self) -> str:
        """Where the subscriber connects (publisher binds) or binds (publisher connects)."""
        if self.endpoint.startswith("tcp://") and self.publisher_binds:
            port = self.endpoint.rsplit(":", 1)[1]
            return f"tcp://127.0.0.1:{port}"
        return self.endpoint


def parse(text: str) -> KvEventsEndpoint | None:
    """The endpoint from the flag's JSON; None when events are off or not sent over ZMQ."""
    if len(text) > MAX_CONFIG_CHARS:
        raise KvEventsConfigError(f"{FLAG} is longer than {MAX_CONFIG_CHARS} characters")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise KvEventsConfigError(f"{FLAG} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise KvEventsConfigError(f"{FLAG} must be a JSON object")
    enabled = doc.get("enable_kv_cache_events", False)
    publisher = doc.get("publisher") or ("zmq" if enabled else "null")
    endpoint = doc.get("endpoint", DEFAULT_ENDPOINT)
    topic = doc.get("topic", "")
    if not isinstance(enabled, bool) or not isinstance(publisher, str):
        raise KvEventsConfigError(
            f"{FLAG}: enable_kv_cache_events must be a boolean and publisher a string"
        )
    if not isinstance(endpoint, str) or not isinstance(topic, str):
        raise KvEventsConfigError(f"{FLAG}: endpoint and topic must be strings")
    if not enabled or publisher != "zmq":
        return None
    if not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
        raise KvEventsConfigError(
            f"{FLAG}: endpoint {endpoint!r} is not tcp://, ipc:// or inproc://"
        )
    if endpoint.startswith("tcp://") and not endpoint.rsplit(":", 1)[-1].isdigit():
        raise KvEventsConfigError(f"{FLAG}: endpoint {endpoint!r} has no port")
    return KvEventsEndpoint(endpoint, topic)


def from_argv(argv: Sequence[str]) -> KvEventsEndpoint | None:
    """The endpoint an engine command publishes on (its `--kv-events-config`), or None."""
    for i, arg in enumerate(argv):
        if arg == FLAG and i + 1 < len(argv):
            return parse(argv[i + 1])
        if arg.startswith(FLAG + "="):
            return parse(arg.split("=", 1)[1])
    return None
