from __future__ import annotations

from llmfabric.registry.records import (
    Hardware,
    Lifecycle,
    NodeMeta,
    NodeRecord,
    ServedModel,
)


def make_record(
    sid: str,
    provider: str = "p1",
    models: tuple[ServedModel, ...] = (ServedModel("m"),),
    state: Lifecycle = Lifecycle.SERVING,
    gpu: str = "H100-SXM",
    gpu_count: int = 1,
) -> NodeRecord:
    return NodeRecord(
        session_id=sid,
        peer_id=f"peer-{sid}",
        public_key=b"",
        state=state,
        incarnation=0,
        version=1,
        updated_at=0.0,
        meta=NodeMeta(
            provider_id=provider,
            http_addr=f"127.0.0.1:{abs(hash(sid)) % 10000 + 20000}",
            hardware=Hardware(gpu_model=gpu, gpu_count=gpu_count),
            models=models,
        ),
    )
