"""Who may call and how much: accounts as the ingress's authenticator, budgets and fair
queueing per request.

Files:
- accounts_auth.py: adapters from llmfabric.accounts (AccountStore, RateLimiter) and
  `StaticKeys` for tests/benchmarks.
- gate.py: `TenancyGate` (budget reservation + fair-queue slot per request; 429 with the
  real wait), `reservation(doc)`.
- attach.py: `attach_tenancy(ingress, store, max_inflight=, env=)` (budgets, fair queue,
  OTLP exporter from settings) -> `TenancyParts`.
"""
