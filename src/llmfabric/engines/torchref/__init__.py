"""The CPU reference engine (`llmfabric engine torch`, extra `llmfabric[torch]`): a small
Llama model served by N gloo processes that switch online between data and tensor
parallelism (Flying Serving; docs/engines-torchref.md).

Files:
  config.py     ModelConfig, presets (tiny-llama, ...), from_hf_config, ByteTokenizer
  weights.py    Model Weights Manager: seeded full replica, zero-copy TP shard views
  kvpool.py     KV Cache Adaptor: one preallocated pool per engine, blocks viewed by width
  blocks.py     BlockAllocator: the scheduler's free lists of KV blocks (no torch)
  comm.py       Communicator Pool: every aligned gloo group built at start-up
  model.py      the Llama forward over a ragged batch with paged KV, at any width
  plans.py      Entry, StepPlan, StepResult, WorkerSpec: what crosses to an engine
  worker.py     one engine process: executes step plans
  scheduler.py  FlyingScheduler: Algorithm 1, the three transition methods, admission
  engine.py     FlyingEngine: starts the workers, steps manually or in a thread
  server.py     the OpenAI-compatible aiohttp server with /dtp_switch and /dtp_status
  train.py      trains a tiny checkpoint on CPU in seconds (the engine's maths, whole
                sequences); `python -m llmfabric.engines.torchref.train --out m.pt`

Only engine.py's workers, model.py, weights.py, kvpool.py and comm.py import torch.
"""
