"""Engines we ship: the simulated OpenAI-compatible engine (`llmfabric engine sim`) and the
CPU reference engine that switches DP <-> TP online (`llmfabric engine torch`, torchref/).

Files:
  sim_server.py  SimEngineConfig, SimEngine (aiohttp app: /health, /v1/models,
                 /v1/chat/completions, /v1/completions, /v1/embeddings, /sim/*), serve()
  protocol.py    OpenAI request validation (pydantic) and response/stream chunk builders
  http_edge.py   what both engines' aiohttp servers share: JSON and OpenAI error responses,
                 request bodies read and validated, listen() with vLLM's ready line
  batcher.py     Batcher: continuous batching (shared decode steps, queued prefills)
  dp.py          data parallelism: `dp` independent replicas of one model behind one engine
  flying_dp.py   FlyingDataParallel (--flying): DP batchers binding into TP batchers under a
                 switching policy; /dtp_status, /dtp_switch
  timing.py      TimingModel protocol; RooflineTiming from llmfabric.sim specs; TableTiming
  text.py        deterministic pseudo-word tokens, approximate token counts, embeddings
  faults.py      FaultState and crash(): crash / hang / slow / fail / log on demand
  kv_publisher.py  the prefix cache's stores/evictions as vLLM's KV-cache events over ZMQ
  pd_role.py     PDRole: prefill/decode roles (--role, /sim/role), vLLM-style
                 kv_transfer_params handles (single-use, bound to their prompt), the
                 KV handoff's wire bytes and link time
  torchref/      the torch engine (extra llmfabric[torch]; its __init__ maps its files)
"""
