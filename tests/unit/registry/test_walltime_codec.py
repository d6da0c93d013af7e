"""The allocation end travels in the signed record; older bodies (without it) still decode,
and bad values never enter."""

from __future__ import annotations

import msgpack
import pytest

from llmfabric.identity.keys import NodeKey
from llmfabric.registry.codec import RECORD_DOMAIN, encode_body, sign_record, verify_record
from llmfabric.registry.errors import InvalidRecord
from llmfabric.registry.owner import RecordOwner
from llmfabric.registry.records import NodeMeta

KEY = NodeKey.generate()


def _signed(**fields: object) -> tuple[bytes, bytes]:
    owner = RecordOwner(KEY, NodeMeta(provider_id="p", alloc_end=1.0, drain_lead_s=1.0),
                        wall=0.0)
    body = msgpack.unpackb(encode_body(owner.record), raw=False)
    for name, value in fields.items():
        if value is None:
            del body["m"][name]
        else:
            body["m"][name] = value
    raw = bytes(msgpack.packb(body, use_bin_type=True))
    return raw, KEY.sign(RECORD_DOMAIN + raw)


def test_round_trip() -> None:
    owner = RecordOwner(KEY, NodeMeta(alloc_end=1_800_000_000.5, drain_lead_s=120.0), wall=0.0)
    signed = sign_record(KEY, owner.record)
    meta = verify_record(signed.body, signed.signature).record.meta
    assert (meta.alloc_end, meta.drain_lead_s) == (1_800_000_000.5, 120.0)


def test_unset_fields_stay_out_of_the_body() -> None:
    owner = RecordOwner(KEY, NodeMeta(provider_id="p"), wall=0.0)
    meta = msgpack.unpackb(encode_body(owner.record), raw=False)["m"]
    assert "alloc_end" not in meta and "drain_lead_s" not in meta


def test_an_older_body_decodes_as_unbounded() -> None:
    meta = verify_record(*_signed(alloc_end=None, drain_lead_s=None)).record.meta
    assert (meta.alloc_end, meta.drain_lead_s) == (0.0, 0.0)


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), 1e13, "soon", True])
def test_bad_values_are_refused_even_when_signed(value: object) -> None:
    with pytest.raises(InvalidRecord) as exc:
        verify_record(*_signed(alloc_end=value))
    assert exc.value.reason == "schema"
