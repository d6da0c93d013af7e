"""The caps an operator sets (`--batch-limit KEY=VALUE`, `batch_limits` in a node's config
file): `batch_limits` parses them into BatchLimits, refusing an unknown key (naming the known
ones) and any value that is not a whole number above 0; `limits_of` is the BatchLimits both
composition roots (the standalone ingress's Settings, a node's NodeConfig) give their
BatchService."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from llmfabric.batch.limits import LIMIT_KEYS, BatchLimits, batch_limits, limits_of
from llmfabric.cli.ingress import Settings
from llmfabric.ingress.config import Timeouts
from llmfabric.node.config import ConfigError, build_config

pytestmark = pytest.mark.unit

MIB = 1024 * 1024


def test_good_values_over_the_defaults() -> None:
    got = batch_limits({"max_lines": "1000", "max_files_per_owner": 20,
                        "max_active_batches_per_owner": "2", "max_output_files_per_owner": 50.0,
                        "max_bytes_per_owner": "200MiB", "max_output_bytes": "2 GiB",
                        "max_file_bytes": "1.5MB"})
    assert got == BatchLimits(max_lines=1000, max_files_per_owner=20,
                              max_active_batches_per_owner=2, max_output_files_per_owner=50,
                              max_bytes_per_owner=200 * MIB, max_output_bytes=2 * 1024 * MIB,
                              max_file_bytes=1_500_000)
    assert all(isinstance(getattr(got, k), int) for k in LIMIT_KEYS)
    assert batch_limits({}) == BatchLimits()
    assert batch_limits({"max_file_bytes": "4096"}).max_file_bytes == 4096  # (bytes: no unit)
    for text, size in (("1kb", 1000), ("1KiB", 1024), ("3gb", 3 * 10 ** 9), ("1TiB", 2 ** 40),
                       ("7b", 7), (" 2 MiB ", 2 * MIB)):
        assert batch_limits({"max_output_bytes": text}).max_output_bytes == size, text
    # The root's own fields ride along; None keeps a default.
    got = batch_limits({"max_lines": 5}, max_line_bytes=123, concurrency=None)
    assert (got.max_lines, got.max_line_bytes, got.concurrency) == (5, 123, 4)


@pytest.mark.parametrize("key,value,said", [
    ("max_lines", 0, "must be at least 1"),
    ("max_lines", "0", "must be at least 1"),
    ("max_bytes_per_owner", "0MiB", "must be at least 1"),
    ("max_lines", -3, "must be at least 1"),
    ("max_lines", "-3", "is not a whole number above 0"),
    ("max_lines", "many", "is not a whole number above 0"),
    ("max_lines", "", "is not a whole number above 0"),
    ("max_lines", "nan", "is not a whole number above 0"),
    ("max_lines", float("nan"), "is not a whole number above 0"),
    ("max_lines", float("inf"), "is not a whole number above 0"),
    ("max_lines", "inf", "is not a whole number above 0"),
    ("max_lines", "2.5", "is not a whole number above 0"),
    ("max_lines", 2.5, "is not a whole number above 0"),
    ("max_lines", "1e5", "is not a whole number above 0"),
    ("max_lines", "10k", "is not a whole number above 0"),
    ("max_files_per_owner", "10MiB", "is not a whole number above 0"),  # (a count: no unit)
    ("max_lines", True, "is not a whole number above 0"),  # (YAML's `yes`)
    ("max_lines", None, "is not a whole number above 0"),
    ("max_file_bytes", "0.5", "is not a whole number of bytes above 0"),
    ("max_file_bytes", "0.3KiB", "is not a whole number of bytes above 0"),
    ("max_file_bytes", "2 parsecs", "is not a whole number of bytes above 0"),
    ("max_output_bytes", "-1GiB", "is not a whole number of bytes above 0"),
])
def test_bad_values_are_refused(key: str, value: object, said: str) -> None:
    with pytest.raises(ValueError, match=said) as exc:
        batch_limits({key: value})
    assert str(exc.value).startswith(f"batch limit {key}=") and "\n" not in str(exc.value)


def test_an_unknown_key_names_the_known_ones() -> None:
    with pytest.raises(ValueError) as exc:
        batch_limits({"max_files": "3"})
    assert str(exc.value) == (
        "unknown batch limit 'max_files' (known: max_file_bytes, max_lines, "
        "max_files_per_owner, max_bytes_per_owner, max_active_batches_per_owner, "
        "max_output_bytes, max_output_files_per_owner)")
    # The two caps set elsewhere are no keys, and say where they come from.
    with pytest.raises(ValueError, match="--batch-concurrency sets it"):
        batch_limits({"concurrency": "8"})
    with pytest.raises(ValueError, match="the ingress's request body cap"):
        batch_limits({"max_line_bytes": "1MiB"})
    with pytest.raises(ValueError, match="max_file_bytes is set twice"):
        batch_limits({"max_file_bytes": "1MiB"}, max_file_bytes=2 * MIB)


def _settings(**batch: Any) -> Settings:
    return Settings(host="127.0.0.1", port=8080, backends=(), policy="random", max_retries=0,
                    max_body_bytes=3 * MIB, auth=False, db_url=None, forward_prefix="",
                    timeouts=Timeouts(1, 1, 1, 1), **batch)


def test_both_roots_give_their_batch_service_the_operator_s_caps(
    tmp_path: pathlib.Path,
) -> None:
    # The standalone ingress (`llmfabric ingress --backend ...`).
    got = limits_of(_settings(batch_dir=tmp_path, batch_concurrency=7, batch_limits=(
        ("max_bytes_per_owner", "64MiB"), ("max_active_batches_per_owner", "1"))))
    assert got == BatchLimits(max_bytes_per_owner=64 * MIB, max_active_batches_per_owner=1,
                              max_line_bytes=3 * MIB, concurrency=7)
    assert limits_of(_settings(batch_max_file_bytes=5 * MIB)).max_file_bytes == 5 * MIB
    assert limits_of(_settings()) == BatchLimits(max_line_bytes=3 * MIB)
    # A node (`llmfabric start --ingress`, a fabric `llmfabric ingress`, a config file).
    config = build_config({"batch_limits": {"max_output_bytes": "1GB", "max_lines": 100}}, {
        "batch_dir": tmp_path, "max_body_bytes": 2 * MIB, "batch_concurrency": 3})
    assert config.batch_limits == {"max_output_bytes": 10 ** 9, "max_lines": 100}
    assert limits_of(config) == BatchLimits(max_output_bytes=10 ** 9, max_lines=100,
                                            max_line_bytes=2 * MIB, concurrency=3)
    config = build_config({}, {"batch_dir": tmp_path, "batch_max_file_bytes": MIB})
    assert limits_of(config).max_file_bytes == MIB
    assert limits_of(build_config({}, {})) == BatchLimits(max_line_bytes=4 * MIB)


def test_a_node_config_refuses_bad_caps_and_batch_options_without_batch_dir(
    tmp_path: pathlib.Path,
) -> None:
    with pytest.raises(ConfigError, match="batch_limits: unknown batch limit 'nope'"):
        build_config({}, {"batch_dir": tmp_path, "batch_limits": {"nope": 1}})
    with pytest.raises(ConfigError, match="batch limit max_lines=0 must be at least 1"):
        build_config({"batch_dir": str(tmp_path), "batch_limits": {"max_lines": 0}}, {})
    with pytest.raises(ConfigError, match="set the same cap: give one"):
        build_config({}, {"batch_dir": tmp_path, "batch_max_file_bytes": MIB,
                          "batch_limits": {"max_file_bytes": "2MiB"}})
    for option, flag in (({"batch_limits": {"max_lines": 5}}, "--batch-limit"),
                         ({"batch_concurrency": 2}, "--batch-concurrency"),
                         ({"batch_retention_s": "30d"}, "--batch-retention"),
                         ({"batch_max_file_bytes": MIB}, "batch_max_file_bytes")):
        with pytest.raises(ConfigError, match=f"{flag} goes with --batch-dir"):
            build_config(option, {})
