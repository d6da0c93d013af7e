"""Which revocation list a node holds travels in its signed record (issue time and digest);
records without it (older nodes, PSK networks) keep their bytes and decode, and bad values
never enter."""

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
    owner = RecordOwner(KEY, NodeMeta(provider_id="p"), wall=0.0)
    body = msgpack.unpackb(encode_body(owner.record), raw=False)
    body["m"].update(fields)
    raw = bytes(msgpack.packb(body, use_bin_type=True))
    return raw, KEY.sign(RECORD_DOMAIN + raw)


def test_round_trip() -> None:
    owner = RecordOwner(KEY, NodeMeta(revocations_at=1_767_225_600.125,
                                      revocations_digest=bytes(range(8))), wall=0.0)
    signed = sign_record(KEY, owner.record)
    meta = verify_record(signed.body, signed.signature).record.meta
    assert (meta.revocations_at, meta.revocations_digest) == (1_767_225_600.125,
                                                              bytes(range(8)))


def test_unset_fields_stay_out_of_the_body_and_older_bodies_decode() -> None:
    owner = RecordOwner(KEY, NodeMeta(provider_id="p"), wall=0.0)
    meta = msgpack.unpackb(encode_body(owner.record), raw=False)["m"]
    assert "revocations_at" not in meta and "revocations_digest" not in meta
    decoded = verify_record(*_signed()).record.meta
    assert (decoded.revocations_at, decoded.revocations_digest) == (0.0, b"")


@pytest.mark.parametrize("fields", [
    {"revocations_at": -1.0}, {"revocations_at": float("nan")},
    {"revocations_at": float("inf")}, {"revocations_at": "new"},
    {"revocations_digest": bytes(33)}, {"revocations_digest": "ab"},
])
def test_bad_values_are_refused_even_when_signed(fields: dict[str, object]) -> None:
    with pytest.raises(InvalidRecord) as exc:
        verify_record(*_signed(**fields))
    assert exc.value.reason == "schema"
