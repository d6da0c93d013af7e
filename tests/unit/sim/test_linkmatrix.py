"""LinkMatrix: construction, CSV loading in both forms and units, reduction to replica pairs."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.sim import Link, SpecError
from llmfabric.sim.linkmatrix import LinkMatrix
from llmfabric.sim.topology import cloud_instances


def test_direct_and_uniform() -> None:
    m = LinkMatrix([[1e9, 2e9, 3e9], [4e9, 5e9, 6e9]], 1e-3)
    assert m.shape == (2, 3)
    assert m.link(1, 2) == Link(6e9, 1e-3) and m[0, 0] == Link(1e9, 1e-3)
    assert m.channel(0, 1) != m.channel(1, 0)
    u = LinkMatrix.uniform(Link(5e9, 2e-5), 2, 2)
    assert u[1, 0] == Link(5e9, 2e-5)
    with pytest.raises(SpecError):
        m.link(2, 0)
    with pytest.raises(SpecError):
        LinkMatrix([[0.0, 1e9]])
    with pytest.raises(SpecError):
        LinkMatrix([[1e9]], -1.0)
    with pytest.raises(SpecError):
        LinkMatrix([1e9, 2e9])


def test_long_csv_gbps_symmetric_with_latency(tmp_path: Path) -> None:
    p = tmp_path / "bw.csv"
    p.write_text("src,dst,Gbps,latency_ms\n0,1,40,2\n0,2,8,1\n1,2,16,0.5\n2,1,80,0.5\n")
    m = LinkMatrix.from_csv(p)
    assert m.row_ids == [0, 1, 2]
    assert m[0, 1] == Link(5e9, 2e-3) and m[1, 0] == Link(5e9, 2e-3)  # symmetric fill
    assert m[1, 2].bandwidth == pytest.approx(2e9)
    assert m[2, 1].bandwidth == pytest.approx(10e9)  # both directions given: kept apart
    with pytest.raises(SpecError, match="itself"):
        m.link(1, 1)


def test_square_csv_gbs_and_round_trip(tmp_path: Path) -> None:
    p = tmp_path / "sq.csv"
    p.write_text("GB/s,a,b,c\na,0,10,3\nb,10,0,2.5\nc,3,2.5,0\n")
    m = LinkMatrix.from_csv(p)
    assert m.row_ids == ["a", "b", "c"] and m[0, 2].bandwidth == pytest.approx(3e9)
    out = tmp_path / "out.csv"
    m.to_csv(out)
    back = LinkMatrix.from_csv(out)
    assert np.allclose(back.bandwidth[~np.eye(3, dtype=bool)],
                       m.bandwidth[~np.eye(3, dtype=bool)])


@pytest.mark.parametrize("text", [
    "src,dst,gbs\n0,1,10\n0,2,10\n",  # pair (1, 2) missing
    "src,dst\n0,1\n",  # no bandwidth column
    "src,dst,gbs,gbps\n0,1,1,8\n",  # two bandwidth columns
    "src,dst,gbs\n0,1,-3\n",
    "src,dst,gbs\n0,1,fast\n",
    "gbs,a,b\na,0,1\n",  # square: one row short
    "only a header\n",
])
def test_bad_csv(tmp_path: Path, text: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(SpecError):
        LinkMatrix.from_csv(p)


def test_from_topology_and_reduce_to_replica_pairs() -> None:
    topo = cloud_instances([("RTX-A6000", 2), ("A40", 2)], inter_gbps=(8, 8), seed=0,
                           efficiency=1.0)
    gpu = LinkMatrix.from_topology(topo)
    assert gpu.shape == (4, 4) and gpu[0, 1].bandwidth == pytest.approx(10e9)
    assert gpu[0, 2].bandwidth == pytest.approx(1e9)  # 8 Gbit/s WAN
    # replica (0, 1) on instance 0 -> replica (2,) and replica (3,) on instance 1
    rep = gpu.reduce([[0, 1]], [[2], [3]])
    assert rep.shape == (1, 2)
    assert rep[0, 0].bandwidth == pytest.approx(1e9)
    assert rep[0, 0].latency_s == pytest.approx(1e-3 + 2 * 5e-6)
    with pytest.raises(SpecError):
        gpu.reduce([[0, 1]], [[1, 2]])
    cross = LinkMatrix.from_topology(topo, rows=[0, 1], cols=[2, 3])
    assert cross[1, 0] == topo.pair_link(1, 2)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.one_of(st.sampled_from(["src", "dst", "gbs", "gbps", "GB/s", "0",
                                                     "1", "2", "-1", "nan", "inf", "1e400",
                                                     "latency_ms", "x", ""]),
                                   st.text(max_size=4)), max_size=5), max_size=6))
def test_hostile_csv_raises_spec_errors_only(tmp_path_factory: pytest.TempPathFactory,
                                             rows: list[list[str]]) -> None:
    p = tmp_path_factory.mktemp("csv") / "m.csv"
    with p.open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    try:
        m = LinkMatrix.from_csv(p)
    except SpecError:
        return
    assert np.all(m.bandwidth[np.isfinite(m.bandwidth)] > 0)


@pytest.mark.parametrize(("text", "match"), [
    ("src,dst,gbs\n0,1,inf\n", r"bandwidth of 0 -> 1 must be finite and > 0, got 'inf'"),
    ("src,dst,gbs\n0,1,nan\n", r"bandwidth of 0 -> 1 must be finite and > 0, got 'nan'"),
    ("src,dst,gbs\n0,1,0\n", r"bandwidth of 0 -> 1 must be finite and > 0, got '0'"),
    ("src,dst,gbs\na,b,fast\n", r"bandwidth of a -> b is not a number: 'fast'"),
    ("src,dst,gbs,latency_ms\n0,1,1,-1\n", r"latency of 0 -> 1 must be finite and >= 0"),
    ("src,dst,gbs\n1,2,10\n01,2,10\n", r"ids '1' and '01' are the same GPU 1"),
    ("src,dst,gbs\n0,1,10\n0,1\n", r"has 2 cells, expected 3"),
    ("gbs,1,01\n1,0,1\n01,1,0\n", r"ids '1' and '01' are the same GPU 1"),
    ("gbs,a,b\na,0,inf\nb,1,0\n", r"bandwidth of a -> b must be finite and > 0"),
    # a misspelt latency column read as no latency at all (every link 0 s) before
    ("src,dst,gbs,latency_usec\n0,1,10,5\n", r"unknown column 'latency_usec'; .*latency_us"),
    ("src,dst,gbs,note\n0,1,10,rack 3\n", r"unknown column 'note'"),
    (b"src,dst,gbs\n0,1,\xff\n", r"bad\.csv is not a CSV file: not UTF-8 text \(a 0xff byte\)"),
])
def test_bad_csv_says_which_pair_or_id(tmp_path: Path, text: str | bytes, match: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(SpecError, match=match):
        LinkMatrix.from_csv(p)


def test_a_long_csv_of_many_gpus_loads_every_pair(tmp_path: Path) -> None:
    """120 GPUs, one row per ordered pair (ids are kept in a dict now: a list lookup per row
    made the load O(GPUs^3); the speed is not asserted here)."""
    n = 120
    p = tmp_path / "big.csv"
    p.write_text("src,dst,gbs\n" + "".join(f"{a},{b},1\n" for a in range(n) for b in range(n)
                                          if a != b))
    m = LinkMatrix.from_csv(p)
    assert m.shape == (n, n) and m.row_ids == list(range(n))
