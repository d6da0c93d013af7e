"""The node's engine: its life, its link to the node and its KV-cache events.

Files:
- role.py: the engine over its life: start, load hints, restart, assign, release, and its
  prefill/decode roles (the role poll; the PD controller's signed role flip).
- link.py: one engine: supervision (agent/) + the forwarded-request proxy (engines bind
  loopback unless --allow-engine-public-bind) + its KV-cache events (ZMQ) followed into the
  held-prefix sketch.
"""
