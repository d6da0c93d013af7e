"""A client's JSON request body, loaded within what the ingress can send on.

orjson reads arrays and objects nested up to 1,024 deep but writes only up to 254, and the
ingress re-serialises many bodies (fabric metadata cut, a usage request added, a translated
API, a model alias, the prefill/decode phases): a body nested deeper failed there with a
500, or a cut connection on the lean front. So a body nested deeper than `MAX_DEPTH` is
refused at once, like malformed JSON. The check costs a byte count on every body and a walk
only when the body holds `MAX_DEPTH` or more brackets.
"""

from __future__ import annotations

from typing import Any

import orjson

MAX_DEPTH = 128  # arrays and objects; far beyond any API's documents, below orjson's 254


class BadJson(ValueError):
    """The body is not a JSON object the ingress can serve; `code` for the error body."""

    def __init__(self, message: str, code: str = "invalid_json") -> None:
        super().__init__(message)
        self.code = code


def load_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, nested at most `MAX_DEPTH` deep (`BadJson` otherwise)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise BadJson(f"request body is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise BadJson("request body must be a JSON object")
    if body.count(b"[") + body.count(b"{") >= MAX_DEPTH and _deeper_than(doc, MAX_DEPTH):
        raise BadJson(f"request body nests arrays and objects more than {MAX_DEPTH} deep",
                      "json_too_deep")
    return doc


def _deeper_than(doc: Any, limit: int) -> bool:
    """Whether `doc` nests containers more than `limit` deep (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values() if isinstance(v, dict | list))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node if isinstance(v, dict | list))
    return False
