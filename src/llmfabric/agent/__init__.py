"""Node agent: engine subprocess supervision, readiness and health, hardware discovery.

Files:
  supervisor.py  EngineSupervisor(SupervisorConfig): spawn in its own process group with logs
                 to a file, wait for /v1/models, health loop, DOWN/FATAL events, stop/drain,
                 the engine's load from its metrics; EngineState, EngineEvent, EngineInfo
  command.py     parse_engine_command: engine adapter and base URL from the command line
  engines.py     EngineKind adapters (vllm, sglang, llama.cpp, llama-cpp-python, tgi, torch,
                 sim, openai): detection, ports, health/metrics/tokenize routes, context flags
  facts.py       served_models, precision_of (flags, GGUF header, config.json), --model-id;
                 engine_context: a running engine's context from /v1/models or /props
  tokenize.py    EngineTokenizer: token counts from the engine's own /tokenize route
  kv_events_config.py  vLLM's --kv-events-config: where an engine publishes KV-cache events
  engine_metrics.py  Prometheus / llama.cpp /slots parsing into EngineLoad; PrefixRate
  proctree.py    the engine's process tree: parent-death signal, /proc walk, kill_tree
  watchdog.py    stdlib-only watchdog process: kills the tree when the node or engine dies;
                 its proc_stat (/proc/PID/stat) is proctree's too
  probe.py       EngineProbe protocol and HttpProbe (/v1/models, /health, GET text/JSON)
  logwatch.py    LogWatcher and DEFAULT_FATAL_PATTERNS (NCCL timeout, CUDA error, ...)
  hardware.py    discover_hardware: NVML / nvidia-smi / CPU, with flag overrides
  inflight.py    InflightTracker: begin/end, close + drained(timeout), load hints
  errors.py      AgentError hierarchy
"""

from llmfabric.agent.command import EngineCommand, parse_engine_command
from llmfabric.agent.errors import (
    AgentError,
    Draining,
    EngineCommandError,
    EngineNotReady,
    EngineStartError,
)
from llmfabric.agent.hardware import discover_hardware
from llmfabric.agent.inflight import InflightTracker
from llmfabric.agent.logwatch import DEFAULT_FATAL_PATTERNS
from llmfabric.agent.supervisor import (
    EngineEvent,
    EngineInfo,
    EngineState,
    EngineSupervisor,
    SupervisorConfig,
)

__all__ = [
    "DEFAULT_FATAL_PATTERNS",
    "AgentError",
    "Draining",
    "EngineCommand",
    "EngineCommandError",
    "EngineEvent",
    "EngineInfo",
    "EngineNotReady",
    "EngineStartError",
    "EngineState",
    "EngineSupervisor",
    "InflightTracker",
    "SupervisorConfig",
    "discover_hardware",
    "parse_engine_command",
]
