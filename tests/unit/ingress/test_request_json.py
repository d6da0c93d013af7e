"""A client's JSON body (ingress/request_json.py `load_object`): what it refuses, and what
refusing costs."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from llmfabric.ingress.request_json import BadJson, load_object

pytestmark = pytest.mark.unit


def test_the_depth_check_still_refuses_what_it_refused() -> None:
    def nested(lists: int, leaf: Any = 0) -> bytes:
        return b"[" * lists + orjson.dumps(leaf) + b"]" * lists

    for depth, ok in ((127, True), (128, True), (129, False), (300, False)):
        for wrap in (lambda d: b'{"a": ' + nested(d - 1) + b"}",  # (d deep in all)
                     lambda d: b'{"a": ' + nested(d - 2, {}) + b"}"):
            body = wrap(depth)
            if ok:
                load_object(body)
            else:
                with pytest.raises(BadJson) as e:
                    load_object(body)
                assert e.value.code == "json_too_deep"
    many = b'{"a": [' + b",".join([b"[[1]]"] * 100) + b"]}"  # many brackets, shallow
    assert load_object(many)["a"][0] == [[1]]


def _seconds(f: Any, *args: Any) -> float:
    t0 = time.perf_counter()
    f(*args)
    return time.perf_counter() - t0


@pytest.mark.hostile
@pytest.mark.parametrize("item", [{}, [0], [[[{}]]], 0])
def test_a_body_of_tiny_containers_costs_about_its_parse(item: Any) -> None:
    """8 MiB of empty objects (2.8 million, each in a list of 10,000): the depth check
    walked every container in Python, 4.3 s of the event loop per request (15 times the
    parse), for any key. It now costs a serialization (about 20 ms)."""
    n = 8 * 1024 * 1024 // (len(orjson.dumps(item)) + 1)
    body = orjson.dumps({"model": "m", "messages": [
        {"role": "user", "content": [item] * 10_000} for _ in range(max(1, n // 10_000))]})
    parse = min(_seconds(orjson.loads, body) for _ in range(2))
    # (generous: the walk took 15 times the parse; a loaded CI machine slows both alike)
    assert _seconds(load_object, body) < 4 * parse + 0.5
