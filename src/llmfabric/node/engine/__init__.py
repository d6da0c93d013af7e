"""The node's engine: its life, its link to the node and its KV-cache events.

Files:
- role.py: the engine over its life: start, load hints, restart, assign, release, and its
  prefill/decode roles (the role poll; the PD controller's signed role flip).
- link.py: one engine: supervision (agent/) + the forwarded-request proxy; engines bind
  loopback unless --allow-engine-public-bind.
- kv_events_link.py: follows the engine's KV-cache events (ZMQ) into the held-prefix
  sketch.
"""
