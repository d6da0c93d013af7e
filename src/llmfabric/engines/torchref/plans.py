"""What crosses the connection between the scheduler and an engine process (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from llmfabric.engines.torchref.config import ModelConfig


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    rank: int
    world: int
    store_port: int
    config: ModelConfig
    widths: tuple[int, ...]
    n_blocks: int
    block_tokens: int
    threads: int = 1


@dataclass(frozen=True, slots=True)
class Entry:
    """One request in a step: `tokens` at positions [start, start + len) whose KV is written
    into the blocks of `table`; positions before `start` are already cached."""

    rid: int
    tokens: list[int]
    start: int
    table: list[int]
    all_logprobs: bool = False  # teacher-forced log-likelihood of every given token


@dataclass(frozen=True, slots=True)
class StepPlan:
    step: int
    group: tuple[int, ...]  # the aligned group this engine runs in at this step
    entries: list[Entry] = field(default_factory=list)  # identical order in a group


@dataclass(frozen=True, slots=True)
class StepResult:
    step: int
    rank: int
    mode_at: float | None  # time.monotonic() when this engine entered a new layout
    outputs: list[tuple[int, np.ndarray, list[float] | None]]  # group leaders only
    pool_ptr: int
    pool_numel: int
    process_groups: int
    compute_s: float
