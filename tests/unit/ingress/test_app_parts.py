from __future__ import annotations

import pytest

from llmfabric.forward import ChoosingForwarder
from llmfabric.ingress import IngressConfig, StaticCandidateSource, Timeouts
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.errors import error_body
from llmfabric.registry.records import Hardware, LoadHints, ServedModel
from llmfabric.routing import Candidate
from llmfabric.testing.sinks import NoSink

from ._fakes import OkUpstream


def cand(sid: str, addr: str = "127.0.0.1:1", relays: tuple[str, ...] = (),
         model: ServedModel | None = None, provider: str = "p") -> Candidate:
    return Candidate(sid, f"peer-{sid}", provider, addr, relays, Hardware("A100", 2),
                     model or ServedModel("m", aliases=("mm",)), LoadHints())


class _Recorder:
    enforces_timeouts = False

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.bodies: list[bytes] = []

    async def open(self, candidate: Candidate, path: str, body: bytes,
                   timeouts: Timeouts) -> OkUpstream:
        self.sent.append(candidate.session_id)
        self.bodies.append(body)
        return OkUpstream()

    async def aclose(self) -> None:
        return None


async def test_choosing_forwarder_uses_the_peer_network_for_relayed_nodes() -> None:
    direct, peer = _Recorder(), _Recorder()
    fwd = ChoosingForwarder(direct, peer)
    await fwd.open(cand("d"), "/v1/chat/completions", b"{}", Timeouts())
    await fwd.open(cand("r", relays=("relay",)), "/v1/chat/completions", b"{}", Timeouts())
    await fwd.open(cand("n", addr=""), "/v1/chat/completions", b"{}", Timeouts())
    assert direct.sent == ["d"] and peer.sent == ["r", "n"]


def test_auth_enabled_without_an_authenticator_is_refused() -> None:
    with pytest.raises(ValueError, match="demo"):
        Ingress(IngressConfig(), StaticCandidateSource([]), _Recorder())


def test_catalog_merges_nodes_and_aliases() -> None:
    src = StaticCandidateSource([
        cand("a", provider="x"),
        cand("b", provider="y", model=ServedModel("m", quantization="fp8", max_context=8192)),
        cand("c", model=ServedModel("other")),
    ])
    ing = Ingress(IngressConfig(auth_enabled=False), src, _Recorder())
    data = {e["id"]: e for e in ing.catalog()["data"]}
    assert data["m"]["providers"] == ["x", "y"] and data["m"]["serving"] == 2
    assert data["m"]["aliases"] == ["mm"] and data["m"]["max_context"] == 8192
    assert data["m"]["quantizations"] == ["bf16", "fp8"] and data["m"]["object"] == "model"
    assert src.candidates("mm") and src.is_known("mm") and not src.is_known("zz")


def test_prefix_extraction_for_affinity() -> None:
    ing = Ingress(IngressConfig(auth_enabled=False, policy="prefix_affinity", prefix_chars=10),
                  StaticCandidateSource([]), _Recorder())
    assert ing.policy.needs_prefix
    chat = {"messages": [{"role": "system", "content": "abcdefgh"},
                         {"role": "user", "content": [{"type": "text", "text": "xyz"}]}]}
    assert ing._prefix(chat) == "abcdefgh\x1ex"  # 10 chars, separator included
    assert ing._prefix({"prompt": ["hello world!"]}) == "hello worl"
    assert ing._prefix({"input": 5}) == ""


async def test_a_non_string_text_part_is_ignored_not_a_500_under_a_prefix_policy() -> None:
    import orjson

    from llmfabric.routing.prefix import prompt_prefix

    bad = {"messages": [{"role": "user", "content": [{"type": "text", "text": 5},
                                                     {"type": "text", "text": "ok"},
                                                     {"type": "text", "text": None}]}]}
    assert prompt_prefix(bad, 10) == "ok"
    fwd = _Recorder()
    ing = Ingress(IngressConfig(auth_enabled=False, policy="prefix_affinity", prefix_chars=10),
                  StaticCandidateSource([cand("a"), cand("b")]), fwd)
    reply = await ing.serve("/v1/chat/completions", True, "", None,
                            orjson.dumps({"model": "m", **bad}), NoSink())
    assert reply is not None and reply.status == 200 and len(fwd.sent) == 1


def test_error_body_has_openai_shape() -> None:
    import orjson

    doc = orjson.loads(error_body(503, "nobody", "no_candidates"))
    assert doc == {"error": {"message": "nobody", "type": "server_error", "param": None,
                             "code": "no_candidates"}}


async def test_a_request_by_alias_reaches_the_engine_under_the_model_id() -> None:
    import orjson

    fwd = _Recorder()
    src = StaticCandidateSource([cand("a", model=ServedModel("llama-3.1-8b", aliases=("l",)))])
    ing = Ingress(IngressConfig(auth_enabled=False), src, fwd)
    for name in ("l", "llama-3.1-8b"):
        body = orjson.dumps({"model": name, "messages": [], "metadata": {"tag": "x"}})
        reply = await ing.serve("/v1/chat/completions", True, "", None, body, NoSink())
        assert reply is not None and reply.status == 200
    sent = [orjson.loads(b) for b in fwd.bodies]
    assert sent == [{"model": "llama-3.1-8b", "messages": [], "metadata": {"tag": "x"}}] * 2
    assert fwd.bodies[1] == orjson.dumps(  # by id: relayed byte for byte
        {"model": "llama-3.1-8b", "messages": [], "metadata": {"tag": "x"}})


