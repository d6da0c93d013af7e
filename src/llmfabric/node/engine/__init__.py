"""The node's engine: its life, its link to the node and its streams' usage.

Files:
- role.py: the engine over its life: start, load hints, restart, assign, release, and its
  prefill/decode roles (the role poll; the PD controller's signed role flip).
- link.py: one engine: supervision (agent/) + the forwarded-request proxy; engines bind
  loopback unless --allow-engine-public-bind.
- kv_events_link.py: follows the engine's KV-cache events (ZMQ) into the held-prefix
  sketch.
- stream_usage.py: counts a stream's tokens when the engine sends no usage (the engine's
  tokenizer; a usage chunk marked estimated before [DONE]).
"""
