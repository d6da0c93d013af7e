"""Per-model token prices, for spend budgets: USD per million prompt and completion tokens
(which is also micro-USD per token). A model without a price costs nothing, so a spend
budget counts only priced models; set a "*" price to charge every other model."""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmfabric.accounts.errors import InvalidRequest

MAX_USD_PER_MTOK = 1e6
DEFAULT_PRICE = "*"


@dataclass(frozen=True, slots=True)
class Price:
    prompt_usd_per_mtok: float
    completion_usd_per_mtok: float

    def micros(self, prompt_tokens: int, completion_tokens: int) -> int:
        """The cost in micro-USD, rounded up."""
        return math.ceil(max(0, prompt_tokens) * self.prompt_usd_per_mtok
                         + max(0, completion_tokens) * self.completion_usd_per_mtok)

    def to_json(self) -> dict[str, float]:
        return {"prompt_usd_per_mtok": self.prompt_usd_per_mtok,
                "completion_usd_per_mtok": self.completion_usd_per_mtok}


def validate_price(model: str, prompt: object, completion: object) -> Price:
    if not model or len(model) > 256:
        raise InvalidRequest("a price's model must be 1..256 characters")
    out = []
    for what, v in (("prompt", prompt), ("completion", completion)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not (
                0 <= v <= MAX_USD_PER_MTOK):
            raise InvalidRequest(f"{what}_usd_per_mtok must be a number in 0..{MAX_USD_PER_MTOK:g}")
        out.append(float(v))
    return Price(out[0], out[1])


def price_of(prices: dict[str, Price], model: str) -> Price | None:
    return prices.get(model) or prices.get(DEFAULT_PRICE)
