"""llmfabric: one OpenAI-compatible LLM service over GPU nodes scattered across clusters.

Packages (pure core first, I/O shell last; see ARCHITECTURE in docs/architecture.md):
  clock        injected time (SystemClock for production, FakeClock in llmfabric.testing)
  untrusted    others' text for terminals, logs and files: printable(), get_logger()
  yamlfile     operators' YAML files read with one-line errors (duplicate keys, alias bombs)
  identity/    node keys, peer ids, signing, admission credentials
  net/         transport: TLS peer channels, bootstrap, reachability, relays
  registry/    CRDT node map and its NodeRegistry/ModelRegistry views
  gossip/      anti-entropy and piggybacked dissemination of registry deltas
  membership/  SWIM failure detection with Lifeguard suspicion
  agent/       node agent: engine supervision, health, hardware discovery
  routing/     candidate filters and load-balancing policies
  ingress/     the OpenAI-compatible request core (transport-agnostic: auth, routing, retries)
  apis/        the Responses and Anthropic Messages APIs over that core, the OpenAPI document
  tenancy/     who may call that core and how much: accounts as auth, budgets, fair queueing
  front/       the ingress's HTTP servers (lean HTTP/1.1 front, aiohttp app) over that core
  forward/     the ingress's upstream clients (direct, peer, data plane) and the EngineProxy
  telemetry/   trace context, OTLP export, the node's hop time, observed demand (ingress + node)
  batch/       OpenAI's Batch API (files, batches, a runner) over an ingress
  accounts/    API keys, usage ledger, rate limits
  dashboard/   web UI
  sim/         roofline operator costs and discrete-event serving simulator
  kvcompress/  2/3/4/8-bit KV quantization for the prefill -> decode hand-off
  scheduler/   placement solver, baselines, fleet controller
  traces/      trace loaders and workload characterization
  bench/       load generator client
  engines/     simulated engine
  cli/         the `llmfabric` command
  testing/     fakes shipped for tests and benchmarks (fake clock, in-memory network)
  dataplane/   the encrypted, mutually authenticated data plane (ingress <-> provider)
  launch/      Slurm and Kubernetes launchers, Slurm fleet sizing, the demo's local fabric
  node/        the node process (`llmfabric start`): the composition root
  controller/  the fleet controller's executors: decisions -> signed requests to the nodes
  __main__     `python -m llmfabric` runs the CLI
"""

__version__ = "0.1.0"
