"""An owner's record always fits the body limit every replica enforces (registry/fit.py):
a worst-case issuer ingress (grants, spend, certificate, demand) used to sign ~18 KiB
records that every peer refused."""

from __future__ import annotations

import dataclasses
import secrets

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.accounts.grants import grants_of
from llmfabric.accounts.models import ApiKey
from llmfabric.accounts.spend_share import encode_spend
from llmfabric.identity import NodeKey
from llmfabric.registry.codec import MAX_BODY_BYTES, decode_record_body, encode_body
from llmfabric.registry.fit import RecordTooLarge, fit_meta
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.records import ModelDemand, NodeMeta, ServedModel

pytestmark = pytest.mark.unit
KEY = NodeKey.generate()


def _grants(n: int):  # type: ignore[no-untyped-def]
    keys = [ApiKey(id="k" + secrets.token_hex(8)[:15], name="n", owner=f"owner-{i % 50}",
                   admin=False, created_at=float(i), requests_per_min=600,
                   tokens_per_min=100_000, hash=secrets.token_hex(32)) for i in range(n)]
    return grants_of(keys)


def _worst(cert_chars: int = 4096, demand: int = 32) -> NodeMeta:
    spend = encode_spend({("key", f"k{i:015d}", "2026-11-24"): 10**6 + i for i in range(200)},
                         1.0)
    return NodeMeta(
        provider_id="uni-example-hpc", peer_addrs=("10.0.0.1:7946", "192.168.1.1:7946"),
        http_addr="10.0.0.1:8080", engine="vllm",
        models=(ServedModel("meta-llama/Llama-3.1-70B-Instruct", aliases=("llama-70b",)),),
        labels=tuple(sorted((f"label{i}", "value" * 5) for i in range(10))), tier="stable",
        roles=("ingress", "relay"),
        demand=tuple(ModelDemand(f"meta-llama/Llama-3.1-70B-Instruct-{i}", 12.5, 1024.3, 256.7)
                     for i in range(demand)),
        cert="x" * cert_chars, keys=_grants(500), spend=spend)


def test_a_worst_case_ingress_record_is_signed_within_the_limit() -> None:
    meta = _worst()
    owner = RecordOwner(KEY, NodeMeta(), wall=1.0)
    full = len(encode_body(dataclasses.replace(owner.record, meta=meta)))
    assert full > MAX_BODY_BYTES  # the case that was refused by every replica
    signed = owner.update_meta(meta, wall=2.0)
    assert len(signed.body) <= MAX_BODY_BYTES
    got = decode_record_body(signed.body).meta  # what every peer accepts now
    # the least needed items went first, and only as far as needed
    assert got.demand == meta.demand[:len(got.demand)] and len(got.demand) < len(meta.demand)
    assert got.keys == meta.keys and got.spend == meta.spend and got.cert == meta.cert
    # a small record is left as it was
    small = owner.update_meta(dataclasses.replace(meta, keys=(), cert=""), wall=3.0)
    assert small.record.meta == dataclasses.replace(meta, keys=(), cert="")


def test_what_cannot_be_shed_is_a_clear_error() -> None:
    meta = NodeMeta(labels=tuple((f"l{i:03d}", "v" * 200) for i in range(100)))
    with pytest.raises(RecordTooLarge, match="labels, model names"):
        RecordOwner(KEY, meta, wall=1.0)


@settings(max_examples=40)
@given(demand=st.integers(0, 32), cert=st.integers(0, 4096), limit=st.integers(500, 20_000))
def test_fit_meta_fits_or_refuses_and_sheds_in_order(demand: int, cert: int, limit: int) -> None:
    meta = _worst(cert, demand)
    record = RecordOwner(KEY, NodeMeta(), wall=1.0).record

    def size(m: NodeMeta) -> int:
        return len(encode_body(dataclasses.replace(record, meta=m)))

    try:
        got, shed = fit_meta(meta, size, limit)
    except RecordTooLarge:
        bare = dataclasses.replace(meta, prefix_cache=b"", demand=(), spend=b"", keys=(),
                                   pd_plan=b"")
        assert size(bare) > limit
        return
    assert size(got) <= limit
    order = ["prefix_cache", "demand", "spend", "keys", "pd_plan"]
    assert list(shed) == sorted(shed, key=order.index)
    for name in order:  # untouched unless shed; a shed list is a prefix of the original
        if name not in shed:
            assert getattr(got, name) == getattr(meta, name)
        elif isinstance(getattr(meta, name), tuple):
            value = getattr(got, name)
            assert value == getattr(meta, name)[:len(value)]
    # every item before the last shed one was shed completely
    for name in shed[:-1]:
        assert not getattr(got, name)


@pytest.mark.hostile
def test_models_answering_to_too_many_names_are_refused_by_replicas_and_owners() -> None:
    """Each list of a model is capped (256 items), but aliases x adapters is not: 200 aliases
    and 200 adapters are 40,601 routing names for one model in a 15 KB record. Replicas
    refuse such a record; an owner refuses to sign one, saying why."""
    from llmfabric.registry.codec import MAX_NAMES, SignedRecord, name_count, sign_record
    from llmfabric.registry.errors import InvalidRecord

    many = ServedModel("m", aliases=tuple(f"a{i}" for i in range(200)),
                       adapters=tuple(f"l{i}" for i in range(200)))
    assert name_count((many,)) == len(many.names()) > MAX_NAMES
    owner = RecordOwner(KEY, NodeMeta(), wall=0.0)
    with pytest.raises(RecordTooLarge, match="answer to 40601 names"):
        owner.update_meta(NodeMeta(models=(many,)), wall=1.0)
    honest = ServedModel("m", aliases=("a", "b"), adapters=tuple(f"l{i}" for i in range(64)))
    assert len(owner.update_meta(NodeMeta(models=(honest,)), wall=1.0).record.meta.models) == 1
    rec = dataclasses.replace(owner.update_meta(NodeMeta(), wall=2.0).record,
                              meta=NodeMeta(models=(many,)))
    forged: SignedRecord = sign_record(KEY, rec)  # signed by hand, past the owner
    with pytest.raises(InvalidRecord, match="40601 names"):
        decode_record_body(encode_body(forged.record))
