"""A request's model fallbacks: the body's `models` list (OpenRouter's "Model Fallbacks").

`models` names the models tried, in order, after `model` (without `model`, its first entry is
the primary). The request core (`Ingress._serve`) moves on to the next model only before any
output reached the client, and only when the current one failed in a way another model can
mend (`falls_back`): unknown on the fabric, no route, every candidate node failed, or an
engine's 429 or 5xx. Caller errors are answered at once. Parsed here only for bodies that
carry the field: a request without it pays one dict lookup.
"""

from __future__ import annotations

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
