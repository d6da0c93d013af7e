"""Who may call and how much: accounts as the ingress's authenticator, budgets and fair
queueing per request.

An edge of the request core (llmfabric.ingress), ranked above it: the core is typed against
the interfaces it defines in ingress/protocols.py (`Authenticator`, `UsageSink`, `Gate`,
`PriceHold`, `CompletionHold`, `Refusal`), which this package implements, and never imports
it. A key's model allowlist, which the core applies on every request, is routing's
(routing/model_access.py).

Files:
- accounts_auth.py: adapters from llmfabric.accounts (AccountStore, RateLimiter) and
  `StaticKeys` for tests/benchmarks.
- gate.py: `TenancyGate` (a `Gate`: budget reservation + fair-queue slot per request, once
  for all its fallback models; 429 with the real wait; `priced`: the names a request may be
  billed as, settled at the served model's id; `HeldPrice`: no model priced above a spend
  hold serves its request; `HeldCompletion`: an uncapped request is capped at its hold on a
  replica of a larger context), `NameLookup` (a listed name's context and ids, from one
  resolution), `reservation(doc)`.
- attach.py: `attach_tenancy(ingress, store, max_inflight=, env=)` (budgets, fair queue,
  OTLP exporter from settings) -> `TenancyParts`; `budget_lookup(ingress)`: the gate's
  `lookup` over the ingress's routing.
"""
