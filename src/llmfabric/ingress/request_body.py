"""What the ingress reads of a client's request body before routing it: the body as a JSON
object (`load_object`), and its model fallbacks (`requested_models`, the `models` field).

The JSON is loaded within what the ingress can send on. orjson reads arrays and objects
nested up to 1,024 deep but writes only up to 254, and the ingress re-serialises many bodies
(fabric metadata cut, a usage request added, a translated API, a model alias, the
prefill/decode phases): a body nested deeper failed there with a 500, or a cut connection on
the lean front. So a body nested deeper than `MAX_DEPTH` is refused at once, like malformed
JSON. The check costs a byte count on every body and, only when the body holds `MAX_DEPTH`
or more brackets, one serialization of it wrapped in arrays (orjson refuses to write past
its depth: C speed, where a walk in Python took 4.3 s for 8 MiB of empty objects).

The model fallbacks are the body's `models` list (OpenRouter's "Model Fallbacks"): the
models tried, in order, after `model` (without `model`, its first entry is the primary).
The request core (`Ingress._serve`) moves on to the next model only before any output
reached the client, and only when the current one failed in a way another model can mend
(`falls_back`): unknown on the fabric, no route, every candidate node failed, or an engine's
429 or 5xx. Caller errors are answered at once. Parsed here only for bodies that carry the
field: a request without it pays one dict lookup.
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


# ---- the model fallbacks (`models`) ---------------------------------------------------------

MAX_MODEL_CHARS = 512  # as a record's model names (registry/codec.py MAX_STR): none is longer
MAX_FALLBACKS = 3  # models tried after the primary
# Entries read at most: the primary (repeated, as OpenRouter clients often send it, or
# standing in for an absent `model`) plus the fallbacks. A longer list is refused unread.
MAX_ENTRIES = MAX_FALLBACKS + 1


class InvalidModels(ValueError):
    """A `models` field the ingress refuses (400 `invalid_models`, param `models`)."""


def requested_models(model: object, models: object) -> tuple[object, tuple[str, ...]]:
    """(the primary, its fallbacks in order) of a body with `model` and a `models` field;
    entries repeating the primary or an earlier entry are skipped. The primary is `model`
    unchecked (the caller validates it, as without a list), or `models[0]` when `model` is
    absent. Raises InvalidModels."""
    if models is None:
        return model, ()
    if not isinstance(models, list):
        raise InvalidModels("'models' must be a list of model names")
    if len(models) > MAX_ENTRIES:
        raise InvalidModels(f"'models' lists at most {MAX_FALLBACKS} fallback models "
                            f"({MAX_ENTRIES} entries with the primary)")
    for name in models:
        if not isinstance(name, str) or not name:
            raise InvalidModels("each entry of 'models' must be a model name (a non-empty "
                                "string)")
        if len(name) > MAX_MODEL_CHARS:
            raise InvalidModels(f"each entry of 'models' is at most {MAX_MODEL_CHARS} "
                                "characters")
    if model is None:
        if not models:
            return None, ()
        model = models[0]
    out: list[str] = []
    for name in models:
        if name != model and name not in out:
            out.append(name)
    if len(out) > MAX_FALLBACKS:
        raise InvalidModels(f"'models' lists at most {MAX_FALLBACKS} fallback models")
    return model, tuple(out)


def falls_back(status: int) -> bool:
    """Whether an engine's answer (or the ingress's own 502/503 for the model) lets the
    request move on to its next model: an overloaded or failing side, never a caller error."""
    return status == 429 or status >= 500
