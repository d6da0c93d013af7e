"""Multi-tenancy at the ingress: token budgets (accounts.budgets) and fair queueing across
owners (accounts.fairqueue), behind three calls the request path makes:

- `gate.admit_at_once(principal) or await gate.admit(principal, doc, path, fallbacks, route)`
  after authentication (the sync call answers the common case, nothing to reserve, without a
  coroutine): reserves the request's worst case on its key's and owner's budgets and in
  their tokens/min buckets, then waits for a fair-queue slot; a `Refusal` (429 with
  Retry-After carrying the real wait) when the budget is used up, a tokens/min bucket is
  empty or the queue is full. Once per request, whatever models it may fall back to; then
  `gate.held_price()`, on a spend budget, bounds the models that may serve it (a dearer one
  may come up under a listed name after admission: `HeldPrice.within`), and
  `gate.held_completion()`, for a request without a cap field, what a replica of a larger
  context than was held may generate (`HeldCompletion`: the request is sent to it capped).
- `gate.used(usage, model)` when the request's usage is known (`model`: the id of the model
  served, what it is billed as: an alias, a `--model-alias` pin or a LoRA adapter is billed
  as the model that runs it).
- `gate.settle()` when the request ends, however it ends (the ingress calls it in a
  `finally`): releases the slot, settles the reservation to what was used and gives the
  tokens/min hold back (the limiter charged what was used when the usage was recorded).

The worst case: the prompt's upper-ish bound (ingress.usage `prompt_token_bound`) plus the
completion cap: the largest cap field times n (and times the prompts of a completions
batch), or, without one, the context of the model
(`advertised_context` of the replicas the request's own filters leave, its allowlist and
QoS constraints: engines generate up to it), and the default only when no node serves the
model. A request with fallback models (`models`, ingress/request_body.py) reserves for the
largest context among them that resolve, and on a spend budget at the dearest price among
the names and the ids they route to (`priced`): whichever model serves it, the hold covers
it. Each name is resolved once for both (`lookup`: `NameLookup`), as the key's model
allowlist cuts it (the ingress has dropped the listed names it allows nothing under:
routing/model_access.py `usable`).

The per-request state lives in a context variable, so the ingress's request path passes
nothing around; each request runs in its own task (one per connection), so states of
concurrent requests never mix.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from llmfabric.accounts.budgets import MAX_BUDGET_TOKENS, BudgetBook, Hold, OverBudget
from llmfabric.accounts.errors import RateLimited
from llmfabric.accounts.fairqueue import FairQueue, QueueRefused
from llmfabric.accounts.policy import MAX_TOKENS_PER_REQUEST
from llmfabric.accounts.ratelimit import RateLimiter, TokenHold
from llmfabric.ingress.paths import NATIVE_RESPONSES_PATH
from llmfabric.ingress.protocols import Principal, Refusal
from llmfabric.ingress.tracing import current_trace
from llmfabric.ingress.usage import (
    MAX_PROMPT_VALUES,
    MEDIA_PART_TOKENS,
    Usage,
    prompt_bound,
    prompt_token_bound,
)
from llmfabric.routing.candidates import Candidate
from llmfabric.routing.request import RouteRequest

# The completion a request without a cap field is assumed to need when the context of its
# model is unknown (no node serves it: nothing will be generated).
DEFAULT_COMPLETION_RESERVE = 512
_MAX_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
# The paths whose requests generate text up to a cap or the context (embeddings, rerank,
# score and tokenize generate none: they keep the default), and the cap fields an engine
# reads on each (vLLM takes a chat request's max_completion_tokens before its max_tokens,
# engines without the newer name read only max_tokens: a chat request is capped by both).
_CAP_FIELDS = {"/v1/chat/completions": ("max_tokens", "max_completion_tokens"),
               "/v1/completions": ("max_tokens",),
               NATIVE_RESPONSES_PATH: ("max_output_tokens",)}
_GENERATING = frozenset(_CAP_FIELDS)


class NameLookup(NamedTuple):
    """A listed model name as admission needs it, from one resolution of the name."""

    context: int  # of the replicas the request's filters leave (0: unknown, or ambiguous)
    ids: Collection[str]  # the ids of the models it routes to (what it is billed as)


# The gate's name lookup: (name, the request's filters, its key's model allowlist: None for
# all) -> the name as admission needs it, from the replicas the key may reach only.
Lookup = Callable[[str, RouteRequest | None, frozenset[str] | None], NameLookup]


@dataclass(frozen=True, slots=True)
class HeldPrice:
    """What a request's spend hold was taken at: `micros` for `prompt` + `completion`
    tokens, the dearest of the models its names routed to at admission. A replica of a
    dearer model may come up under one of its names later (while it retries or moves through
    its fallbacks); served there, it would spend past its hold, and concurrent such
    requests past the budget, so the request core keeps it to the models `within` it."""

    book: BudgetBook
    prompt: int
    completion: int
    micros: int

    def within(self, candidates: Sequence[Candidate]) -> Sequence[Candidate]:
        """The candidates whose model (the id a request is billed as) costs no more than
        the hold (`candidates` itself when all do)."""
        cost = self.book.cost_micros
        dear = {i for i in {c.model.id for c in candidates}
                if cost(i, self.prompt, self.completion) > self.micros}
        return [c for c in candidates if c.model.id not in dear] if dear else candidates

    def refusal(self, model: str, candidates: Sequence[Candidate]) -> str:
        """Why a request for `model`, whose `candidates` all cost more, is not served."""
        ids = sorted({c.model.id for c in candidates})
        shown = ", ".join(repr(i) for i in ids[:3]) + (
            f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        return (f"no node can serve model {model!r} within what this request reserved: the "
                f"model serving it now ({shown}) costs more than the request's spend budget "
                "hold, taken when it was admitted (a node came up under that name since, or "
                "the price rose); retry later: a new request reserves at its price")


@dataclass(frozen=True, slots=True)
class HeldCompletion:
    """What a request without a cap field held on its budget for each completion: `tokens`,
    the context its names' replicas advertised at admission (their upper median, or the
    default when none served them). A replica of a larger context (one that came up under a
    listed name since, or one above its model's median) would generate past it, and
    concurrent such requests past the budget, so the request core sends it to such a
    replica capped at `tokens` (`capped`: its cap fields set, as the engine reads them).

    `room`: the hold's share of each of the request's completions (n for each prompt of a
    completions batch): the whole hold, prompt bound and completions, over their number.
    Each completion and its prompt share a context, so the request uses at most that
    context times the completions, and a replica whose context is within `room` cannot go
    past the hold; it gets the request as the client sent it: an engine refuses a cap that,
    with the prompt, overflows its context (vLLM's 400), which the cap would make of a
    request the replica can serve. With one completion `room` is its prompt's bound plus
    `tokens`; with several it is below the largest prompt's bound plus `tokens` (a short
    prompt's completion may take more than `tokens`, what the others leave unused cannot
    be known before), so a batch of uneven prompts may be capped on a replica whose
    context its longest prompt with `tokens` overflows (that prompt's 400: the hold's
    price). Above `room`, `tokens` leaves the prompt its place. A replica advertising no
    context (0: unknown, e.g. a static engine that reports none and no `--max-context`) is
    capped too: its context may be anything, and the budget's bound must hold."""

    tokens: int
    room: int
    fields: tuple[str, ...]

    def binds(self, candidate: Candidate) -> bool:
        """Whether `candidate` could generate past the hold (its request is capped)."""
        context = candidate.model.max_context
        return context <= 0 or context > self.room

    def capped(self, doc: Mapping[str, Any], model: str | None = None) -> dict[str, Any]:
        """`doc` with its cap fields set to `tokens` (and `model`, the engine's name)."""
        out = {**doc, **dict.fromkeys(self.fields, self.tokens)}
        if model is not None:
            out["model"] = model
        return out


@dataclass(slots=True)
class _Admitted:
    hold: Hold | None = None
    held_price: HeldPrice | None = None  # with a spend budget among the hold's
    held_completion: HeldCompletion | None = None  # uncapped, with a budget
    tokens: TokenHold | None = None  # taken from the tokens/min buckets (RateLimiter.hold)
    slot_since: float | None = None
    model: str = ""
    used: list[int] = field(default_factory=lambda: [0, 0])  # prompt, completion tokens


_STATE: ContextVar[_Admitted | None] = ContextVar("llmfabric_tenancy", default=None)


def reservation(doc: Mapping[str, Any], default_completion: int = DEFAULT_COMPLETION_RESERVE,
                context: int = 0) -> int:
    """The request's worst case in tokens: its prompt bound plus its completion cap."""
    return sum(reservation_parts(doc, default_completion, context))


def _count(v: object) -> int | None:
    """A positive token or choice count as an engine reads it (pydantic's lax ints take
    "5000", " 5_000 " and 5000.0), rounded up and clamped; None when it is not one (an
    engine refuses the request then; a bool counts as absent, its 1 is below any default)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, str):
        try:
            v = float(v.strip())
        except ValueError:
            return None
    if not isinstance(v, int | float) or v != v or v <= 0:
        return None
    return MAX_TOKENS_PER_REQUEST if v >= MAX_TOKENS_PER_REQUEST else math.ceil(v)


def reservation_parts(doc: Mapping[str, Any],
                      default_completion: int = DEFAULT_COMPLETION_RESERVE,
                      context: int = 0) -> tuple[int, int]:
    """(prompt bound, completion cap) of a request, in tokens. The cap is the largest of
    the cap fields (an engine takes max_completion_tokens before max_tokens, so the first
    one found is not enough), or `context` (the model's context, 0: unknown) without one,
    or `default_completion` without either; at most `context` when it is known, times n
    and times the prompts of a completions batch: never less than what the engine may
    generate."""
    cap = _completion_cap(doc, default_completion, context)
    times = _completions(doc)
    if times > 1:
        cap = min(cap * times, MAX_BUDGET_TOKENS)  # (a budget clamps a reservation anyway)
    return prompt_token_bound(doc), cap


def _completion_cap(doc: Mapping[str, Any], default_completion: int, context: int) -> int:
    """The cap of one completion (`reservation_parts`, before n and a batch's prompts)."""
    caps = [c for k in _MAX_TOKEN_FIELDS if (c := _count(doc.get(k))) is not None]
    ctx = min(context, MAX_TOKENS_PER_REQUEST) if context > 0 else 0
    cap = max(caps) if caps else ctx or default_completion
    return min(cap, ctx) if ctx else cap  # (an engine generates no more than its context)


def _completions(doc: Mapping[str, Any]) -> int:
    """The completions a request generates: n for each prompt of a completions batch."""
    n = _count(doc.get("n"))
    return (n if n is not None and n > 1 else 1) * _prompts(doc.get("prompt"))


def _prompts(prompt: object) -> int:
    """The prompts of a completions request: a list of texts or of token-id lists is a
    batch, each prompt generating its own completions (one prompt of ids is a list of ints)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return len(prompt)
    return 1


def advertised_context(candidates: Iterable[Candidate]) -> int:
    """The context a model's replicas advertise (`max_context`), for the reservation of a
    request without a cap field: the upper median of the positive values (0: none). Honest
    replicas of one model mostly agree; the largest would let one member that claims a
    context of 1e8 have every such request refused for its budget, the smallest let one
    that claims 1 shrink every reservation, and the upper median needs half the replicas
    for either."""
    contexts = sorted(c.model.max_context for c in candidates if c.model.max_context > 0)
    return contexts[len(contexts) // 2] if contexts else 0


def priced(models: Iterable[str], found: Iterable[NameLookup] = ()) -> set[str]:
    """The names a request for `models` may be billed as: each name and the ids of the
    models they route to (`found`: their lookups; a request's hold is at the dearest of them;
    it is billed as the id that serves it, so an unpriced alias is no way around a price)."""
    names = set(models)
    for f in found:
        names.update(f.ids)
    return names


def _prompt_hint(doc: Mapping[str, Any]) -> str:
    """What a refused request's prompt reserved, when that is not its text: media parts, or
    a prompt of more values than the bound reads (walked again: refusals only)."""
    bound = prompt_bound(doc)
    if bound.cut:
        return (f"; its prompt has more than {MAX_PROMPT_VALUES} values, so it reserves the "
                f"most a request may ({bound.tokens} tokens)")
    if bound.media_parts:
        return (f"; its prompt reserves {bound.tokens} tokens, {MEDIA_PART_TOKENS} for each "
                f"of its {bound.media_parts} image, audio, video or file parts")
    return ""


def _uncapped(doc: Mapping[str, Any]) -> bool:
    return all(_count(doc.get(k)) is None for k in _MAX_TOKEN_FIELDS)


def _token_limited(principal: Principal) -> bool:
    """Whether the key, or its owner, has a tokens/min limit (accounts.models.ApiKey)."""
    return (getattr(principal, "tokens_per_min", None) is not None
            or getattr(principal, "owner_tokens_per_min", None) is not None)


def _owner(principal: Principal | None) -> tuple[str, str, str]:
    """(key id, owner, issuer: "" for a key of ours, else the ingress that issued it)."""
    if principal is None:
        return "", "", ""
    return (principal.id, str(getattr(principal, "owner", principal.id)),
            str(getattr(principal, "issuer", "")))


class TenancyGate:
    def __init__(self, budgets: BudgetBook | None = None, queue: FairQueue | None = None,
                 *, default_completion: int = DEFAULT_COMPLETION_RESERVE,
                 lookup: Lookup | None = None,
                 rate: RateLimiter | None = None,
                 on_refused: Callable[[str], None] | None = None,
                 on_queue_wait: Callable[[float], None] | None = None) -> None:
        self.budgets = budgets
        self.queue = queue
        self.default_completion = default_completion
        # (model, the request's filters, the key's allowlist) -> the context in tokens of
        # the replicas it may reach (for requests without a cap field) and the ids of the
        # models the name routes to (an alias, a pin or an adapter is billed as the model
        # that runs it: `priced`), from one resolution of the name
        self.lookup = lookup
        # The keys' tokens/min buckets: the worst case is held there at admission (the
        # ingress checked the bucket before reading the body; many requests may pass that
        # check at once, so the hold checks again).
        self.rate = rate
        self.on_refused = on_refused  # (reason) for metrics
        self.on_queue_wait = on_queue_wait  # (seconds waited) for metrics
        # No request has had state yet (nothing reserved or queued, ever): used() and
        # settle() then have nothing to look up, and no stale state can be left to clear.
        self._stateless = True

    def admit_at_once(self, principal: Principal | None) -> bool:
        """True (admitted) when there is nothing to reserve or queue for: the common case,
        no budget set for this key or its owner and no fair queue. No state is kept, so
        used() and settle() are no-ops; a budget set later applies from the key's next
        request on. False: `await admit()` decides. (Sync: no coroutine per request.)"""
        book = self.budgets
        if self.queue is not None or (principal is not None and (
                (book is not None and book.applies(*_owner(principal)))
                or (self.rate is not None and _token_limited(principal)))):
            return False
        if not self._stateless:
            _STATE.set(None)
        if (tr := current_trace()) is not None:
            tr.phase("queue")
        return True

    async def admit(self, principal: Principal | None, doc: Mapping[str, Any],
                    path: str = "/v1/chat/completions", fallbacks: Sequence[str] = (),
                    route: RouteRequest | None = None) -> Refusal | None:
        """`fallbacks`: the models the request may be served by after `doc["model"]`;
        `route`: its allowlist and QoS constraints (which replicas it may reach)."""
        if self.admit_at_once(principal):
            return None
        key_id, owner, issuer = _owner(principal)
        book = self.budgets
        state = _Admitted()
        self._stateless = False
        _STATE.set(state)
        state.model = str(doc.get("model", ""))
        models = (state.model, *fallbacks)
        budgeted = (book is not None and principal is not None
                    and book.applies(key_id, owner, issuer))
        uncapped = path in _GENERATING and _uncapped(doc)
        # Each name resolved once, when its context (no cap field) or the ids it routes to
        # (a budget with prices: with none, every model costs nothing) are needed.
        found: Sequence[NameLookup] = ()
        if (lookup := self.lookup) is not None and (
                uncapped or (budgeted and book is not None and bool(book.prices))):
            allowed = principal.models if principal is not None else None
            found = [lookup(m, route, allowed) for m in models]
        context = max(f.context for f in found) if uncapped and found else 0  # (0: none)
        prompt, completion = reservation_parts(doc, self.default_completion, context)
        cost = prompt + completion
        if self.rate is not None and principal is not None and _token_limited(principal):
            # A tokens/min limit smooths a rate (the budget is the hard cap): an uncapped
            # request holds the default completion there, not the context, which would take
            # the whole bucket and run a key's uncapped requests one at a time.
            rate_cost = prompt + (min(completion, self.default_completion) if context
                                  else completion)
            try:
                state.tokens = self.rate.hold(key_id, rate_cost)
            except RateLimited as exc:
                secs = max(1, math.ceil(exc.retry_after_s))
                return self._refused("rate_limited", f"rate limit exceeded for this key "
                                     f"({exc.limit}); retry after {secs} s", secs)
        if budgeted and book is not None:
            micros = max(book.cost_micros(m, prompt, completion) for m in priced(models, found))
            got = book.reserve(key_id, owner, cost, micros, issuer=issuer)
            if isinstance(got, OverBudget):
                self.settle()
                hint = ""
                if context:
                    whose = "the largest context of its models" if fallbacks else (
                        "the model's context")
                    hint = (f"; this request sets no max_tokens, so it reserves {whose} "
                            f"({completion} tokens): set max_tokens to what it needs")
                return self._refused("budget_exceeded", got.message() + hint
                                     + _prompt_hint(doc), got.retry_after_s)
            state.hold = got
            if any(unit != "tokens" for _, _, unit in got.parts):
                state.held_price = HeldPrice(book, prompt, completion, micros)
            if uncapped:
                each = _completion_cap(doc, self.default_completion, context)
                # (room: the hold's share per completion, `HeldCompletion`)
                state.held_completion = HeldCompletion(
                    each, (prompt + completion) // _completions(doc), _CAP_FIELDS[path])
        if self.queue is not None:
            t0 = self.queue.now()
            slot = await self.queue.acquire(owner, cost)
            if isinstance(slot, QueueRefused):
                self.settle()
                what = ("has too many requests waiting" if slot.reason == "queue_full"
                        else "waited too long")
                return self._refused(
                    slot.reason, f"the fabric is saturated and owner {owner!r} {what} "
                    f"({slot.waiting} waiting); retry after the expected wait",
                    slot.retry_after_s)
            state.slot_since = slot
            if self.on_queue_wait is not None:
                self.on_queue_wait(slot - t0)
        if (tr := current_trace()) is not None:
            tr.phase("queue")
        return None

    def _refused(self, code: str, message: str, wait_s: float) -> Refusal:
        if self.on_refused is not None:
            self.on_refused(code)
        secs = max(1, int(wait_s + 0.999))
        return Refusal(429, message, "insufficient_quota" if code == "budget_exceeded"
                       else "rate_limit_exceeded", None, {"Retry-After": str(secs)})

    def held_price(self) -> HeldPrice | None:
        """The spend hold of the request under way (after `admit`), which bounds the models
        that may serve it; None without one (token budgets count tokens whatever model)."""
        if self._stateless:
            return None
        state = _STATE.get()
        return state.held_price if state is not None else None

    def held_completion(self) -> HeldCompletion | None:
        """The completion hold of the request under way (after `admit`) when it has no cap
        field and a budget: it bounds what a replica of a larger context may generate;
        None otherwise (a cap field bounds it, and without a budget nothing is held)."""
        if self._stateless:
            return None
        state = _STATE.get()
        return state.held_completion if state is not None else None

    def used(self, usage: Usage | None, model: str = "") -> None:
        """The request's usage, served by `model` (what the settlement prices; "": the
        model it was admitted for)."""
        if self._stateless:
            return
        state = _STATE.get()
        if state is not None and model:
            state.model = model
        if state is not None and usage is not None:
            state.used[0] += max(0, usage[0])
            state.used[1] += max(0, usage[1])

    def settle(self) -> None:
        if self._stateless:
            return
        state = _STATE.get()
        if state is None:
            return
        _STATE.set(None)
        if state.slot_since is not None and self.queue is not None:
            self.queue.release(state.slot_since)
            state.slot_since = None
        if state.tokens is not None and self.rate is not None:
            self.rate.release(state.tokens)
            state.tokens = None
        if state.hold is not None and self.budgets is not None:
            p, c = state.used
            self.budgets.settle(state.hold, p + c, self.budgets.cost_micros(state.model, p, c))
            state.hold = None
