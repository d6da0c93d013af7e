import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.net.errors import FrameError, GarbledFrame, OversizedFrame, WrongVersion
from llmfabric.net.framing import (
    HEADER,
    Frame,
    FrameDecoder,
    FrameType,
    decode_routed,
    encode_frame,
    encode_routed,
)

frames_st = st.lists(st.tuples(st.integers(1, 255), st.binary(max_size=300)), max_size=20)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for p in points:
        out.append(data[prev:p])
        prev = p
    out.append(data[prev:])
    return out


@given(frames_st, st.lists(st.integers(0, 10_000), max_size=10))
def test_roundtrip_under_any_chunking(frames, cuts):
    wire = b"".join(encode_frame(t, p) for t, p in frames)
    dec = FrameDecoder()
    got: list[Frame] = []
    for piece in split(wire, cuts):
        got.extend(dec.feed(piece))
    assert [(f.type, f.payload) for f in got] == frames
    assert dec.buffered == 0


def test_oversized_frame_is_rejected_before_buffering():
    dec = FrameDecoder(max_payload=100)
    with pytest.raises(OversizedFrame):
        dec.feed(HEADER.pack(1, FrameType.DGRAM, 101))


def test_wrong_version_is_rejected():
    with pytest.raises(WrongVersion):
        FrameDecoder().feed(encode_frame(FrameType.DGRAM, b"x", version=2))


def test_type_zero_is_garbled_and_decoder_stays_failed_until_reset():
    dec = FrameDecoder()
    with pytest.raises(GarbledFrame):
        dec.feed(b"\x01\x00\x00\x00\x00\x00")
    with pytest.raises(GarbledFrame):
        dec.feed(encode_frame(FrameType.DGRAM, b"ok"))
    dec.reset()
    assert dec.feed(encode_frame(FrameType.DGRAM, b"ok")) == [Frame(FrameType.DGRAM, b"ok")]


@settings(max_examples=300)
@given(st.binary(max_size=2000), st.lists(st.integers(0, 5000), max_size=8))
def test_fuzz_decoder_only_raises_frame_errors_and_recovers(garbage, cuts):
    dec = FrameDecoder(max_payload=512)
    try:
        for piece in split(garbage, cuts):
            for f in dec.feed(piece):
                assert 1 <= f.type <= 255 and len(f.payload) <= 512
    except FrameError:
        pass
    dec.reset()
    good = encode_frame(FrameType.PING, b"alive")
    assert dec.feed(good) == [Frame(FrameType.PING, b"alive")]


@given(st.text(min_size=1, max_size=60), st.binary(max_size=100))
def test_routed_roundtrip(peer, payload):
    assert decode_routed(encode_routed(peer, payload)) == (peer, payload)


@given(st.binary(max_size=40))
def test_routed_garbage_raises_garbled_only(data):
    with contextlib.suppress(GarbledFrame):
        peer, rest = decode_routed(data)
        assert peer and len(rest) <= len(data)


@pytest.mark.parametrize("step", [1, 7, 4096])
def test_large_frame_in_small_reads_then_more_frames_in_the_same_read(step):
    big = bytes(range(256)) * 40
    wire = encode_frame(FrameType.H2_TO_SERVER, big) + encode_frame(FrameType.DGRAM, b"after")
    dec = FrameDecoder()
    got: list[Frame] = []
    for i in range(0, len(wire), step):
        got.extend(dec.feed(wire[i : i + step]))
    assert got == [Frame(FrameType.H2_TO_SERVER, big), Frame(FrameType.DGRAM, b"after")]
    assert all(type(f.payload) is bytes for f in got) and dec.buffered == 0
