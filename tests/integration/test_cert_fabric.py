"""A certificate network with real processes: each node's membership certificate names its
provider, the node publishes it in its record, every replica checks it, and the routing
allowlist matches the certified provider, never the `--provider` name a node claims."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import openai
import pytest

from llmfabric.identity.keys import NodeKey
from llmfabric.launch.local import EngineSpec, LocalFabric

pytestmark = [pytest.mark.slow, pytest.mark.hostile]
MODEL = "qwen3-1.7b"


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFabric]:
    root: pathlib.Path = tmp_path_factory.mktemp("certnet")
    with LocalFabric(root, operator=NodeKey.generate()) as fab:
        fab.cert_providers.update({"ingress": "fabric-ops", "honest": "my-lab",
                                   "spoofer": "evil-corp"})
        fab.start_ingress()
        fab.add_node(EngineSpec(MODEL, "L40S", provider="my-lab", speed=50), "honest")
        # certified as evil-corp, but claims to be my-lab
        fab.add_node(EngineSpec(MODEL, "L40S", provider="my-lab", speed=50), "spoofer")
        fab.wait_serving({MODEL: 2}, timeout=120)
        yield fab


def test_the_certificate_not_the_claim_decides_who_gets_my_lab_s_traffic(
    fabric: LocalFabric,
) -> None:
    assert fabric.ingress is not None
    nodes = {n["session_id"]: n for n in fabric.ingress.get_json("/v1/fabric/nodes")["nodes"]
             if n["state"] == "SERVING"}
    verified = {n["verified_provider"] for n in nodes.values()}
    assert {"my-lab", "evil-corp"} <= verified
    assert all(n["provider_id"] == "my-lab" for n in nodes.values())  # both claim it
    by_provider = {n["verified_provider"]: sid for sid, n in nodes.items()}
    client = openai.OpenAI(base_url=fabric.ingress.http_url + "/v1",
                           api_key=fabric.admin_key(), max_retries=0)
    for provider in ("my-lab", "evil-corp"):
        for i in range(6):
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": f"{provider} {i}"}],
                max_tokens=2, extra_headers={"X-Fabric-Providers": provider})
            assert raw.headers.get("x-fabric-node") == by_provider[provider]
    providers = fabric.ingress.get_json("/v1/fabric/providers")["providers"]
    claimed = next(p for p in providers if p["id"] == "my-lab")
    assert claimed["verified"] == ["evil-corp", "my-lab"]  # one claim, two real providers
