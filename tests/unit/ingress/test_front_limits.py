import pathlib

import pytest

from llmfabric.ingress.front.front_limits import FrontLimits, front_limits, safe_header_value
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
