import pathlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmfabric.front.front_limits import (
    ClientSlots,
    FrontLimits,
    front_limits,
    safe_header_value,
)
from llmfabric.node.config import ConfigError, build_config

pytestmark = pytest.mark.unit


def test_overrides_are_typed_and_checked() -> None:
    got = front_limits({"header_timeout_s": "2.5", "max_connections_per_client": "64"})
    assert got == FrontLimits(header_timeout_s=2.5, max_connections_per_client=64)
    assert isinstance(got.max_connections_per_client, int)
    with pytest.raises(ValueError, match="unknown front limit 'nope'"):
        front_limits({"nope": 1})
    with pytest.raises(ValueError, match="not a number"):
        front_limits({"max_headers": "many"})
    with pytest.raises(ValueError, match=">= 1"):
        front_limits({"max_headers": 0})
    with pytest.raises(ValueError, match="handshake_timeout_s must be > 0"):
        front_limits({"handshake_timeout_s": 0})


@given(st.lists(st.tuples(st.booleans(), st.sampled_from("abc")), max_size=60))
def test_client_slots_keep_both_caps_and_give_back_exactly(ops: list[tuple[bool, str]]) -> None:
    """Any sequence of connections opening (True) and closing (False, one the client holds):
    the counts match the connections held, never pass a cap, and refusals are counted."""
    slots = ClientSlots(FrontLimits(max_connections=5, max_connections_per_client=2))
    held: dict[str, int] = {}
    refused = 0
    for opening, client in ops:
        if opening:
            got = slots.take(client)
            fits = sum(held.values()) < 5 and held.get(client, 0) < 2
            assert got == fits
            if got:
                held[client] = held.get(client, 0) + 1
            else:
                refused += 1
        elif held.get(client):
            slots.give_back(client)
            held[client] -= 1
        assert slots.total == sum(held.values()) <= 5
        assert slots.per_source == {c: n for c, n in held.items() if n}
        assert slots.refused == refused


def test_node_config_names_a_bad_front_limit(tmp_path: pathlib.Path) -> None:
    cfg = build_config({"front_limits": {"body_timeout_s": 5}},
                       {"home": tmp_path, "network_secret": "s" * 24})
    assert front_limits(cfg.front_limits).body_timeout_s == 5
    with pytest.raises(ConfigError, match="front_limits"):
        build_config({"front_limits": {"bogus": 1}}, {"home": tmp_path})


@pytest.mark.parametrize(("raw", "safe"), [
    ("node-1", "node-1"), ("a\r\nX-Evil: 1", "aX-Evil: 1"), ("\x00\x7fz", "z"),
    ("caf\u00e9", "caf"), ("", "")])
def test_safe_header_value(raw: str, safe: str) -> None:
    assert safe_header_value(raw) == safe


def test_read_deadlines_and_the_key_memo() -> None:
    from llmfabric.front.front_limits import KeyMemo

    lim = FrontLimits(header_timeout_s=20.0, body_timeout_s=30.0, auth_memo_s=5.0)
    assert lim.overdue(19.9, False, 0.0, 0.0) is None
    assert "head did not arrive within 20.0 s" in (lim.overdue(20.0, False, 0.0, 0.0) or "")
    assert lim.overdue(100.0, True, 0.0, 70.1) is None  # (a slow head no longer counts)
    assert "no request body bytes for 30.0 s" in (lim.overdue(100.0, True, 0.0, 70.0) or "")
    memo = KeyMemo(lim)
    assert not memo.fresh("k", 0.0)
    memo.remember("k", 0.0)
    assert memo.fresh("k", 4.9) and not memo.fresh("k", 5.0) and not memo.fresh("j", 1.0)
    for i in range(KeyMemo.MAX_KEYS + 1):
        memo.remember(f"x{i}", 0.0)
    memo.remember("last", 0.0)  # past the bound everything is forgotten, then this kept
    assert memo.fresh("last", 1.0) and not memo.fresh("k", 1.0)
