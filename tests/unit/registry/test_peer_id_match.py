"""`peer_id_matches` says no to a key of the wrong length (a peer's record or fact), and only
that: anything else it raised would be a bug, which it no longer hides as "not a match"."""

from __future__ import annotations

import pytest

from llmfabric.identity.keys import NodeKey
from llmfabric.registry import signing
from llmfabric.registry.signing import peer_id_matches

pytestmark = pytest.mark.unit


def test_a_key_of_the_wrong_length_is_not_a_match() -> None:
    key = NodeKey.generate()
    assert peer_id_matches(key.peer_id, key.public_bytes)
    assert not peer_id_matches(key.peer_id, key.public_bytes[:31])
    assert not peer_id_matches(key.peer_id, b"")


def test_a_bug_in_the_derivation_is_not_taken_for_a_mismatch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(raw: bytes) -> str:
        raise AttributeError("derivation bug")

    monkeypatch.setattr(signing, "_identity_peer_id", broken)
    key = NodeKey.generate()
    with pytest.raises(AttributeError):
        peer_id_matches(key.peer_id, key.public_bytes)
