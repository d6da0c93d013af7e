"""A client's JSON body (ingress/request_body.py `load_object`): what it refuses, and what
refusing costs."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from llmfabric.ingress.request_body import BadJson, load_object
from llmfabric.testing.work import python_lines

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


@pytest.mark.hostile
@pytest.mark.parametrize("item", [{}, [0], [[[{}]]], 0])
def test_a_body_of_tiny_containers_costs_no_walk(item: Any) -> None:
    """Empty containers by the hundred thousand: the depth check walked every container in
    Python, 4.3 s of the event loop for 8 MiB of them (15 times the parse), for any key. It
    now runs the same few Python lines whatever the body's size (one serialization, in C).
    Counted, not timed: a walk would run a line per container and stop at the limit."""
    def lines(lists: int) -> int:
        body = orjson.dumps({"model": "m", "messages": [
            {"role": "user", "content": [item] * 1_000} for _ in range(lists)]})
        doc, n = python_lines(load_object, body, limit=10_000)
        assert doc["messages"][-1]["content"][-1] == item
        return n

    small, large = lines(100), lines(400)  # (a walk: +300,000 containers, as many lines)
    assert small <= 1_000 and large <= small + 100
