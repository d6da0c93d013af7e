"""One engine process: a gloo rank with a full weight replica, its KV pool and the
communicator pool; it executes the step plans the coordinator sends over a pipe.

Started as `python -m llmfabric.engines.torchref.worker HOST:PORT RANK` (no multiprocessing
spawn: it would re-import the parent's __main__); the authkey comes in $LLMFABRIC_TORCHREF_KEY.
It connects back to the coordinator's Listener and exchanges pickled tuples (no tensors cross
the connection; logits travel as numpy arrays):
  worker -> coordinator  ("hello", rank), then ("ready", info) | ("done", StepResult) |
                         ("error", text)
  coordinator -> worker  WorkerSpec, then ("step", StepPlan) | ("stop",)
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time
import traceback
from multiprocessing.connection import Client, Connection

import numpy as np

from llmfabric.engines.torchref.plans import StepPlan, StepResult, WorkerSpec


def worker_main(address: str, rank: int) -> None:
    # the coordinator owns shutdown: a signal to the process group must not kill an engine
    # mid-collective; a worker exits on "stop" or when the coordinator's connection closes
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    host, port = address.rsplit(":", 1)
    key = bytes.fromhex(os.environ.pop("LLMFABRIC_TORCHREF_KEY", ""))
    conn = Client((host, int(port)), authkey=key)
    conn.send(("hello", rank))
    spec: WorkerSpec = conn.recv()
    try:
        _run(spec, conn)
    except EOFError:  # the coordinator is gone
        return
    except Exception:  # report to the coordinator rather than die silently
        conn.send(("error", traceback.format_exc()))
        raise


def _run(spec: WorkerSpec, conn: Connection) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    from llmfabric.engines.torchref.comm import CommunicatorPool
    from llmfabric.engines.torchref.kvpool import KVPool
    from llmfabric.engines.torchref.model import forward
    from llmfabric.engines.torchref.weights import WeightsManager, init_weights

    torch.set_num_threads(spec.threads)
    store = TCPStore("127.0.0.1", spec.store_port, None, False)
    # a peer that died leaves collectives waiting: fail them in a minute, not gloo's 30
    dist.init_process_group("gloo", store=store, rank=spec.rank, world_size=spec.world,
                            timeout=datetime.timedelta(seconds=60))
    comms = CommunicatorPool(spec.world, spec.widths)
    weights = init_weights(spec.config)
    manager = WeightsManager(spec.config, weights)
    for w in spec.widths:  # build every view once: a switch then only looks them up
        if w > 1:
            manager.shard(w, spec.rank % w)
    pool = KVPool(spec.config, spec.n_blocks, spec.block_tokens)
    conn.send(("ready", {"rank": spec.rank, "pid": os.getpid(),
                         "pool_ptr": pool.tensor.data_ptr(), "pool_numel": pool.tensor.numel(),
                         "process_groups": comms.created(),
                         "weight_storages": len(manager.storages())}))
    current: tuple[int, ...] = (spec.rank,)
    with torch.inference_mode():
        while True:
            msg = conn.recv()
            if msg[0] == "stop":
                break
            plan: StepPlan = msg[1]
            mode_at = None
            if plan.group != current:  # set_TP_mode / reset_TP_mode at the agreed step
                current = plan.group
                mode_at = time.monotonic()
            width = len(plan.group)
            rank_in = plan.group.index(spec.rank)
            group = comms.group(plan.group) if width > 1 else None
            t0 = time.perf_counter()
            outs = forward(spec.config, weights, manager.shard(width, rank_in), pool, width,
                           group, plan.entries)
            compute = time.perf_counter() - t0
            leader = rank_in == 0
            payload = [(o.rid, o.logits.numpy().astype(np.float32), o.token_logprobs)
                       for o in outs] if leader else []
            conn.send(("done", StepResult(plan.step, spec.rank, mode_at, payload,
                                          pool.tensor.data_ptr(), pool.tensor.numel(),
                                          comms.created(), compute)))
    dist.destroy_process_group()


if __name__ == "__main__":
    # run the importable module's function, so pickled classes name that module, not __main__
    from llmfabric.engines.torchref import worker as _worker

    _worker.worker_main(sys.argv[1], int(sys.argv[2]))
