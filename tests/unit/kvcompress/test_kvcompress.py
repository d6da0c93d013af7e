"""kvcompress: error bound per group, exact byte accounting, packing, hostile inputs, and the
simulator's KV byte count agreeing with the real quantizer's."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from llmfabric import kvcompress as kc
from llmfabric import sim

pytestmark = pytest.mark.unit

finite16 = st.floats(-1000, 1000, allow_nan=False, allow_infinity=False, width=16)
shapes = st.tuples(st.integers(0, 70), st.integers(0, 40))


def _group_scales(t: kc.QuantizedKV) -> np.ndarray:
    """The fp16 scale that governs every element, shaped like the (non-tail) tensor."""
    _n, c = t.shape
    s = t.scales.astype(np.float32)
    if t.kind == "key":
        return np.repeat(s, t.group, axis=0)
    return s[:, np.arange(c) // t.group]


@settings(max_examples=60, deadline=None)
@given(shape=shapes, bits=st.sampled_from(kc.BITS), group=st.sampled_from([1, 3, 32, 64]),
       data=st.data())
def test_error_at_most_half_a_step_per_group(shape, bits, group, data):
    x = data.draw(arrays(np.float16, shape, elements=finite16)).astype(np.float32)
    for quant in (kc.quantize_keys, kc.quantize_values):
        t = quant(x, bits, group)
        y = kc.dequantize(t)
        assert y.shape == x.shape
        rows = (x.shape[0] // group) * group if t.kind == "key" else x.shape[0]
        err = np.abs(y[:rows] - x[:rows])
        s = _group_scales(t)[:rows]
        assert np.all(err <= s / 2 * (1 + 1e-5) + 1e-6), (t.kind, err.max())
        # the key tail travels in fp16: exact for fp16 inputs
        assert np.array_equal(y[rows:], x[rows:])


@settings(max_examples=40, deadline=None)
@given(shape=shapes, bits=st.sampled_from(kc.BITS), group=st.sampled_from([1, 5, 64]),
       data=st.data())
def test_scale_is_the_group_range_over_the_levels(shape, bits, group, data):
    x = data.draw(arrays(np.float16, shape, elements=finite16)).astype(np.float32)
    n = x.shape[0]
    t = kc.quantize_values(x, bits, group)
    levels = (1 << bits) - 1
    for i in range(n):
        for g in range(t.scales.shape[1]):
            seg = x[i, g * group:(g + 1) * group]
            span = seg.max() - seg.min() + abs(seg.min()) * 2**-10
            assert t.scales[i, g] <= span / levels * (1 + 2**-9) + 1.2e-7
            assert t.mins[i, g] <= seg.min()


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), c=st.integers(0, 200), bits=st.sampled_from(kc.BITS),
       group=st.sampled_from([1, 7, 32, 64, 128]))
def test_wire_bytes_match_the_accounting(n, c, bits, group):
    x = np.zeros((n, c), np.float32)
    assert kc.quantize_keys(x, bits, group).nbytes == kc.key_bytes(n, c, bits, group)
    assert kc.quantize_values(x, bits, group).nbytes == kc.value_bytes(n, c, bits, group)


def test_whole_groups_cost_bits_plus_metadata():
    # 4-bit, G = 64: 4.5 bits per element, a 16/4-bit ratio of 3.56 (not 4)
    assert kc.bytes_per_element(4, 64) == 0.5625
    assert kc.key_bytes(128, 64, 4, 64) == 128 * 64 * 0.5625
    assert kc.value_bytes(128, 64, 4, 64) == 128 * 64 * 0.5625
    assert 2 / kc.bytes_per_element(4, 32) == pytest.approx(3.2)
    assert 2 / kc.bytes_per_element(4, 128) == pytest.approx(3.76, abs=0.01)
    # a 10-token key tail costs fp16 bytes; 3-bit codes round up to whole bytes
    assert kc.key_bytes(74, 64, 4, 64) == 64 * 64 // 2 + 64 * 4 + 10 * 64 * 2
    assert kc.value_bytes(1, 3, 3, 64) == 2 + 4


@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from(kc.BITS), data=st.data())
def test_pack_round_trips(bits, data):
    codes = data.draw(st.lists(st.integers(0, (1 << bits) - 1), max_size=100))
    buf = kc.pack(codes, bits)
    assert buf.size == -(-len(codes) * bits // 8)
    assert kc.unpack(buf, bits, len(codes)).tolist() == codes


def test_four_bit_codes_pack_low_nibble_first():
    assert kc.pack([0x1, 0xA, 0xF], 4).tolist() == [0xA1, 0x0F]
    assert kc.pack([1, 2, 3, 0], 2).tolist() == [0b00111001]


@pytest.mark.parametrize("model", ["llama-30b", "llama-3.1-8b", "llama-3.1-70b"])
@pytest.mark.parametrize("bits,group", [(4, 64), (4, 32), (2, 128), (3, 64), (8, 64)])
def test_simulator_kv_bytes_agree_with_the_quantizer(model, bits, group):
    spec = sim.get_model(model)
    for n in (group, 16 * group):   # whole key groups: exact agreement
        assert sim.kv_transfer_bytes(spec, n, bits, group) == pytest.approx(
            kc.model_kv_bytes(spec, n, bits, group), rel=1e-12)
    # a partial key group: the simulator's figure undercounts by the fp16 tail only
    n = 16 * group + 5
    tail = spec.n_layers * 5 * spec.kv_dim * (2 - kc.bytes_per_element(bits, group))
    assert kc.model_kv_bytes(spec, n, bits, group) - sim.kv_transfer_bytes(
        spec, n, bits, group) == pytest.approx(tail, rel=1e-9)


def test_a_real_layer_quantized_costs_what_the_simulator_counts():
    spec = sim.get_model("llama-3.1-8b")
    rng = np.random.default_rng(0)
    n = 256
    k = rng.normal(size=(n, spec.kv_dim)).astype(np.float16)
    v = rng.normal(size=(n, spec.kv_dim)).astype(np.float16)
    wire = kc.quantize_keys(k, 4, 64).nbytes + kc.quantize_values(v, 4, 64).nbytes
    assert wire * spec.n_layers == pytest.approx(sim.kv_transfer_bytes(spec, n, 4, 64))


@pytest.mark.parametrize("bad", [
    np.array([[np.nan]]), np.array([[np.inf]]), np.array([[1e6]]), np.zeros(3),
    np.zeros((2, 2, 2)), np.array([["a"]]),
])
def test_hostile_tensors_raise_value_error(bad):
    with pytest.raises(ValueError):
        kc.quantize_keys(bad)
    with pytest.raises(ValueError):
        kc.quantize_values(bad)


@pytest.mark.parametrize("bits,group", [(5, 64), (16, 64), (4, 0), (4, -1), (4, 2.5)])
def test_bad_bits_or_group_raise(bits, group):
    with pytest.raises(ValueError):
        kc.quantize_keys(np.zeros((4, 4)), bits, group)
    with pytest.raises(ValueError):
        kc.key_bytes(4, 4, bits, group)


def test_unpack_refuses_short_buffers_and_pack_out_of_range_codes():
    with pytest.raises(ValueError):
        kc.unpack(np.zeros(1, np.uint8), 4, 3)
    with pytest.raises(ValueError):
        kc.pack([16], 4)


def test_fewer_bits_lose_more():
    x = np.random.default_rng(1).normal(size=(128, 128)).astype(np.float32)
    errs = [float(np.abs(kc.dequantize(kc.quantize_keys(x, b, 64)) - x).mean())
            for b in (2, 3, 4, 8)]
    assert errs == sorted(errs, reverse=True)


def _hostile_records() -> list[tuple[str, kc.QuantizedKV]]:
    import dataclasses as dc

    rng = np.random.default_rng(0)
    k = kc.quantize_keys(rng.standard_normal((130, 16)), 4, 64)
    v = kc.quantize_values(rng.standard_normal((130, 16)), 4, 64)
    nan = np.full_like(v.scales, np.nan)
    return [
        ("group 0", dc.replace(k, group=0)),
        ("group -64", dc.replace(k, group=-64)),
        ("bits 16", dc.replace(k, bits=16)),
        ("kind", dc.replace(k, kind="both")),
        ("shape negative", dc.replace(k, shape=(-5, 16))),
        ("shape past the codes", dc.replace(v, shape=(10**9, 10**6))),
        ("codes too long", dc.replace(v, codes=np.zeros(v.codes.size * 50, np.uint8))),
        ("scales short", dc.replace(v, scales=v.scales[:3])),
        ("mins of keys short", dc.replace(k, mins=k.mins[:, :3])),
        ("tail rows", dc.replace(k, tail=np.zeros((5, 16), np.float16))),
        ("tail on values", dc.replace(v, tail=np.zeros((2, 16), np.float16))),
        ("scales NaN", dc.replace(v, scales=nan)),
        ("mins inf", dc.replace(k, mins=np.full_like(k.mins, np.inf))),
        ("tail NaN", dc.replace(k, tail=np.full_like(k.tail, np.nan))),
        ("scales float32", dc.replace(v, scales=v.scales.astype(np.float32))),
    ]


@pytest.mark.hostile
@pytest.mark.parametrize("name", [n for n, _ in _hostile_records()])
def test_dequantize_refuses_a_record_that_disagrees_with_its_header(name: str) -> None:
    """A quantized tensor as a hostile prefill node would send it: dequantize took the
    record as given (group 0 raised ZeroDivisionError, short scales a broadcasting error,
    unused trailing codes passed, NaN scales came out as NaN KV). Every such record is a
    ValueError now, before any allocation of the declared shape."""
    t = dict(_hostile_records())[name]
    with pytest.raises(ValueError):
        kc.dequantize(t)
