"""Observed demand travels in the signed record: round trip, and bad values never enter."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from llmfabric.identity.keys import NodeKey
from llmfabric.registry.codec import RECORD_DOMAIN, encode_body, sign_record, verify_record
from llmfabric.registry.errors import InvalidRecord
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.records import ModelDemand, NodeMeta

KEY = NodeKey.generate()


def _signed_with_demand(demand: list[dict[str, object]]) -> tuple[bytes, bytes]:
    """A record body whose meta carries `demand` as given, correctly signed by its owner."""
    owner = RecordOwner(KEY, NodeMeta(provider_id="p"), wall=0.0)
    body = msgpack.unpackb(encode_body(owner.record), raw=False)
    body["m"]["demand"] = demand
    raw = bytes(msgpack.packb(body, use_bin_type=True))
    return raw, KEY.sign(RECORD_DOMAIN + raw)


def test_demand_round_trips_through_the_signed_record() -> None:
    demand = (ModelDemand("llama", 2.5, 612.0, 87.5), ModelDemand("qwen", 0.1, 0.0, 0.0))
    owner = RecordOwner(KEY, NodeMeta(provider_id="p", demand=demand), wall=0.0)
    signed = sign_record(KEY, owner.record)
    assert verify_record(signed.body, signed.signature).record.meta.demand == demand


def test_records_without_demand_still_decode() -> None:
    raw, _ = _signed_with_demand([])
    body = msgpack.unpackb(raw, raw=False)
    del body["m"]["demand"]  # as an older node writes it
    old = bytes(msgpack.packb(body, use_bin_type=True))
    assert verify_record(old, KEY.sign(RECORD_DOMAIN + old)).record.meta.demand == ()


@pytest.mark.parametrize("entry", [
    {"model": "m", "rate": -1.0, "mean_in": 1.0, "mean_out": 1.0},
    {"model": "m", "rate": float("nan"), "mean_in": 1.0, "mean_out": 1.0},
    {"model": "m", "rate": float("inf"), "mean_in": 1.0, "mean_out": 1.0},
    {"model": "m", "rate": 1.0, "mean_in": "many", "mean_out": 1.0},
    {"model": 7, "rate": 1.0, "mean_in": 1.0, "mean_out": 1.0},
    {"rate": 1.0, "mean_in": 1.0, "mean_out": 1.0},
])
def test_garbled_demand_is_refused_even_when_signed(entry: dict[str, object]) -> None:
    raw, sig = _signed_with_demand([entry])
    with pytest.raises(InvalidRecord) as exc:
        verify_record(raw, sig)
    assert exc.value.reason == "schema"


def test_a_valid_signed_demand_entry_is_accepted() -> None:
    raw, sig = _signed_with_demand([{"model": "m", "rate": 1, "mean_in": 2, "mean_out": 3}])
    meta = verify_record(raw, sig).record.meta
    assert meta.demand == (ModelDemand("m", 1.0, 2.0, 3.0),)
    assert dataclasses.replace(meta, demand=()) == NodeMeta(provider_id="p")
