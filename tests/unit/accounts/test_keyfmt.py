from __future__ import annotations

from llmfabric.accounts import keyfmt


def test_new_key_parses_and_hashes() -> None:
    key_id, plain = keyfmt.new_key()
    assert plain.startswith("lf-")
    assert keyfmt.parse_key_id(plain) == key_id
    h = keyfmt.hash_key(plain)
    assert plain not in h and len(h) == 64
    assert keyfmt.matches(plain, h)
    assert not keyfmt.matches(plain + "x", h)


def test_keys_are_unique_and_malformed_rejected() -> None:
    keys = {keyfmt.new_key()[1] for _ in range(200)}
    assert len(keys) == 200
    for bad in ("", "lf-", "sk-abc", "lf-zz-" + "a" * 43, "lf-0123456789abcdef-short"):
        assert keyfmt.parse_key_id(bad) is None
