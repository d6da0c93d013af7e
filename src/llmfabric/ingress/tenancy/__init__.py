"""Who may call and how much: accounts as the ingress's authenticator, budgets and fair
queueing per request.

Files:
- accounts_auth.py: adapters from llmfabric.accounts (AccountStore, RateLimiter) and
  `StaticKeys` for tests/benchmarks.
- gate.py: `TenancyGate` (budget reservation + fair-queue slot per request, once for all
  its fallback models; 429 with the real wait; `priced`: the names a request may be billed
  as, settled at the served model's id; `HeldPrice`: no model priced above a spend hold
  serves its request; `HeldCompletion`: an uncapped request is capped at its hold on a
  replica of a larger context), `NameLookup` (a listed name's context and ids, from one
  resolution), `reservation(doc)`.
- model_access.py: a key's model allowlist where names resolve: `permitted` (the allowed
  candidates of a name, aliases and adapters by their model id), `no_access` (the 403),
  `catalog_within` (GET /v1/models cut to the allowed ids).
- attach.py: `attach_tenancy(ingress, store, max_inflight=, env=)` (budgets, fair queue,
  OTLP exporter from settings) -> `TenancyParts`; `budget_lookup(ingress)`: the gate's
  `lookup` over the ingress's routing.
"""
