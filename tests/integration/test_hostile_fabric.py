"""Real processes against an admitted attacker: it holds the network secret, joins over the
real TLS transport, and gossips EVICT facts (and unrefutable suspicions) for every session of
the fabric. The honest nodes must all stay SERVING and keep answering requests. On main
(281af93) one EVICT from any member evicted its target."""

from __future__ import annotations

import asyncio
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from llmfabric.gossip.wire import Gossip, encode
from llmfabric.identity.admission import PskAdmission
from llmfabric.identity.keys import NodeKey
from llmfabric.launch.local import EngineSpec, LocalFabric
from llmfabric.net import TlsTransport
from llmfabric.net.config import TransportConfig
from llmfabric.registry.facts import FactKind, make_fact
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.records import Lifecycle, NodeMeta, ServedModel
from llmfabric.registry.replica import item_parts

pytestmark = [pytest.mark.slow, pytest.mark.hostile]
MODEL = "llama-3.1-8b"


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFabric]:
    root: pathlib.Path = tmp_path_factory.mktemp("hostile")
    with LocalFabric(root) as fab:
        fab.start_ingress()
        for i in range(3):
            fab.add_node(EngineSpec(MODEL, "H100-SXM", provider=f"uni-{i}", speed=50))
        fab.wait_serving({MODEL: 3}, timeout=120)
        yield fab


def _nodes(fab: LocalFabric) -> list[dict[str, Any]]:
    assert fab.ingress is not None
    nodes: list[dict[str, Any]] = fab.ingress.get_json("/v1/fabric/nodes")["nodes"]
    return nodes


async def _attack(fab: LocalFabric, duration_s: float) -> int:
    """Join as an admitted member and gossip EVICTs for everyone for `duration_s`."""
    key = NodeKey.generate()
    transport = TlsTransport(key, PskAdmission("default", fab.secret.encode()),
                             TransportConfig(host="127.0.0.1", port=0))
    transport.set_handler(lambda peer, data: None)  # answers no probe: a silent attacker
    await transport.start()
    sent = 0
    try:
        peers = [await transport.connect(n.peer_addr) for n in [fab.ingress, *fab.nodes]
                 if n is not None]
        me = RecordOwner(key, NodeMeta(provider_id="uni-0", models=(ServedModel(MODEL),)),
                         wall=time.time())
        own = item_parts(me.set_state(Lifecycle.SERVING, wall=time.time()))
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            victims = [n for n in _nodes(fab) if n["peer_id"] != key.peer_id]
            items = [own]
            for v in victims:
                for kind, inc in ((FactKind.EVICT, v["incarnation"]),
                                  (FactKind.EVICT, v["incarnation"] + 1),
                                  (FactKind.SUSPECT, 2**63 - 1)):
                    items.append(item_parts(make_fact(key, kind, v["session_id"], inc,
                                                      time.time())))
            for p in peers:
                for i in range(0, len(items), 20):
                    transport.send(p, encode(Gossip(tuple(items[i:i + 20])), me.session_id))
                    sent += 1
            await asyncio.sleep(2.0)
    finally:
        await transport.aclose()
    return sent


def test_a_member_gossiping_evicts_for_everyone_evicts_nobody(fabric: LocalFabric) -> None:
    states = {n["session_id"]: n["state"] for n in _nodes(fabric)}
    before = {sid for sid, st in states.items() if st == "SERVING"}
    assert len(states) == 4 and len(before) == 3  # the ingress and three providers
    # longer than the largest suspicion timeout of the `local` preset at this size (~24 s)
    sent = asyncio.run(_attack(fabric, 30.0))
    assert sent > 0
    time.sleep(2.0)
    for node in [fabric.ingress, *fabric.nodes]:
        assert node is not None and node.alive(), fabric.tail(node)  # type: ignore[arg-type]
        view = {n["session_id"]: n for n in node.get_json("/v1/fabric/nodes")["nodes"]}
        for sid, state in states.items():  # nobody evicted, nobody left
            # (an evicted node restarts under a new session: its old one may be gone)
            assert view.get(sid, {}).get("state") == state, (node.name, view.get(sid))
    client = openai.OpenAI(base_url=fabric.ingress.http_url + "/v1",  # type: ignore[union-attr]
                           api_key=fabric.admin_key(), max_retries=0)
    served_by = set()
    for i in range(12):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": f"still there {i}"}],
            max_tokens=2)
        served_by.add(raw.headers.get("x-fabric-node"))
    assert served_by <= before and len(served_by) >= 2


def test_a_node_claiming_another_provider_s_name_gets_none_of_its_traffic(
    fabric: LocalFabric,
) -> None:
    """A member starts a node with `--provider uni-0` (an honest provider's name) serving the
    same model. On a PSK network a provider is its key: the allowlist that names uni-0's key
    reaches only uni-0; the bare name reaches nobody."""
    spoofer = fabric.add_node(EngineSpec(MODEL, "H100-SXM", provider="uni-0", speed=50),
                              "spoofer")
    fabric.wait_serving({MODEL: 4}, timeout=120)
    spoofer_peer = spoofer.get_json("/v1/fabric/self")["peer_id"]
    nodes = [n for n in _nodes(fabric) if n["state"] == "SERVING"]  # not the earlier attacker
    claimed = {n["peer_id"] for n in nodes if n["provider_id"] == "uni-0"}
    honest = {n["peer_id"] for n in nodes if n["provider_id"] == "uni-0"} - {spoofer_peer}
    assert len(claimed) == 2 and len(honest) == 1
    honest_sessions = {n["session_id"] for n in nodes if n["peer_id"] in honest}
    client = openai.OpenAI(base_url=fabric.ingress.http_url + "/v1",  # type: ignore[union-attr]
                           api_key=fabric.admin_key(), max_retries=0)
    for i in range(10):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": f"only uni-0 {i}"}],
            max_tokens=2, extra_headers={"X-Fabric-Providers": next(iter(honest))})
        assert raw.headers.get("x-fabric-node") in honest_sessions
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "by name"}], max_tokens=2,
            extra_headers={"X-Fabric-Providers": "uni-0"})
    assert err.value.status_code == 503
