"""A client's JSON request body, loaded within what the ingress can send on.

orjson reads arrays and objects nested up to 1,024 deep but writes only up to 254, and the
ingress re-serialises many bodies (fabric metadata cut, a usage request added, a translated
API, a model alias, the prefill/decode phases): a body nested deeper failed there with a
500, or a cut connection on the lean front. So a body nested deeper than `MAX_DEPTH` is
refused at once, like malformed JSON. The check costs a byte count on every body and, only
when the body holds `MAX_DEPTH` or more brackets, one serialization of it wrapped in arrays
(orjson refuses to write past its depth: C speed, where a walk in Python took 4.3 s for
8 MiB of empty objects).
"""

from __future__ import annotations

from typing import Any

import orjson

MAX_DEPTH = 128  # arrays and objects; far beyond any API's documents, below orjson's 254
_ORJSON_WRITES = 254  # the deepest orjson writes (deeper: "Recursion limit reached")


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
    if body.count(b"[") + body.count(b"{") >= MAX_DEPTH and _deeper_than_max(doc):
        raise BadJson(f"request body nests arrays and objects more than {MAX_DEPTH} deep",
                      "json_too_deep")
    return doc


def _deeper_than_max(doc: Any) -> bool:
    """Whether `doc` nests containers more than `MAX_DEPTH` deep: wrapped in as many arrays
    as orjson writes beyond MAX_DEPTH, it serializes only if it is not."""
    for _ in range(_ORJSON_WRITES - MAX_DEPTH):
        doc = [doc]
    try:
        orjson.dumps(doc)
    except orjson.JSONEncodeError:
        return True  # (a loaded document fails to write for its depth only)
    return False
