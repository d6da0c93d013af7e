"""Flying Serving's switching policies: when to bind DP engines into a TP group and when to
release them (COMPANIONS §2.5).

A policy is a pure function of an observed `SwitchState` that returns `Bind`/`Release`
actions; the engine applies them at its next agreed step boundary. Policies are registered by
name in `SWITCH_POLICIES` (factories taking keyword options) and are shared by the simulator,
the simulated engine and the torch reference engine (engines/torchref).

Groups are always aligned segments [k w, (k+1) w) of width w (a power of two allowed by
`widths`), the only groups the Communicator Pool builds at start-up.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

Method = Literal["sequential", "soft", "hard"]
METHODS: tuple[Method, ...] = ("sequential", "soft", "hard")


@dataclass(frozen=True, slots=True)
class Pending:
    """A queued request as a policy sees it: tokens it needs (prompt + max output), its
    priority and the engine whose queue holds it."""

    tokens: int
    priority: int = 0
    engine: int = 0


@dataclass(frozen=True, slots=True)
class SwitchState:
    """What a policy observes. `groups` partitions range(n) into aligned segments (a singleton
    is a DP engine); per-engine lists are indexed by engine; `free_kv` is free KV in tokens at
    width 1 (a W-wide group holds the sum of its members' free tokens)."""

    width: int
    groups: tuple[tuple[int, ...], ...]
    waiting: tuple[int, ...]
    running: tuple[int, ...]
    free_kv: tuple[int, ...]
    widths: tuple[int, ...] = (1, 2)
    now: float = 0.0  # seconds since the engine started
    mode_since: float = 0.0
    arrival_rate: float = 0.0  # EWMA requests/s
    pending: tuple[Pending, ...] = ()
    running_priority: int = 0  # highest priority among running requests
    running_wide: int = 0  # running requests that need a group wider than one engine

    @property
    def n(self) -> int:
        return len(self.waiting)


@dataclass(frozen=True, slots=True)
class Bind:
    engines: tuple[int, ...]
    method: Method = "hard"


@dataclass(frozen=True, slots=True)
class Release:
    engines: tuple[int, ...]


Action = Bind | Release


class SwitchPolicy(Protocol):
    def __call__(self, state: SwitchState) -> list[Action]: ...


def aligned_groups(n: int, widths: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """Every aligned segment of every allowed width > 1: for n=4, widths (1, 2, 4) ->
    (0, 1), (2, 3), (0, 1, 2, 3). Fewer than 2n groups in all."""
    if n < 1:
        raise ValueError("need at least one engine")
    out: list[tuple[int, ...]] = []
    for w in sorted(set(widths)):
        if w < 1 or w & (w - 1) or n % w:
            raise ValueError(f"width {w} must be a power of two dividing {n}")
        if w > 1:
            out.extend(tuple(range(k * w, (k + 1) * w)) for k in range(n // w))
    return tuple(out)


def segment(engine: int, width: int) -> tuple[int, ...]:
    start = engine // width * width
    return tuple(range(start, start + width))


def _bound(state: SwitchState) -> list[tuple[int, ...]]:
    return [g for g in state.groups if len(g) > 1]


def _release_all(state: SwitchState) -> list[Action]:
    return [Release(g) for g in _bound(state)]


def actions_for_width(state: SwitchState, width: int, method: Method = "hard") -> list[Action]:
    """Actions that bring every engine into aligned groups of `width` (1: all DP)."""
    if width <= 1:
        return _release_all(state)
    target = [segment(k * width, width) for k in range(state.n // width)]
    if sorted(state.groups) == sorted(target):
        return []
    out: list[Action] = [Release(g) for g in _bound(state) if g not in target]
    out += [Bind(g, method) for g in target if g not in state.groups]
    return out


def _widest(state: SwitchState) -> int:
    return max(w for w in state.widths if state.n % w == 0)


# -- the policies ---------------------------------------------------------------------------


def load_threshold(theta: int = 3, method: Method = "hard") -> SwitchPolicy:
    """The released code's `traffic_load` rule: fewer than `theta` waiting on engine 0 ->
    all engines as one TP group; otherwise DP (routing then picks the least loaded)."""

    def policy(state: SwitchState) -> list[Action]:
        if state.waiting[0] < theta:
            return actions_for_width(state, _widest(state), method)
        return _release_all(state)

    return policy


def hysteresis(mu_tp: float = 8.0, dwell_s: float = 2.0, low: float = 0.5, high: float = 0.8,
               method: Method = "hard", rate_window_s: float = 5.0) -> SwitchPolicy:
    """Default policy. TP when the arrival rate is under `low` x mu_TP and fewer than W wait;
    DP when it exceeds `high` x mu_TP by two standard errors of the rate estimate (an EWMA
    over `rate_window_s`, as `ewma_rate` keeps it), or when 3W wait; no change within
    `dwell_s` of the last one.
    `mu_tp` is the TP group's service rate in requests/s (from the cost model)."""

    def policy(state: SwitchState) -> list[Action]:
        if state.now - state.mode_since < dwell_s:
            return []
        w = _widest(state)
        waiting = sum(state.waiting)
        rate, err = rate_bounds(state, rate_window_s)
        if state.width == 1 and rate < low * mu_tp and waiting < w:
            return actions_for_width(state, w, method)
        # overload only when the rate clears high x mu_TP by two standard errors of its
        # estimate: a spike of a calm stream must not split a group that keeps up, since a
        # release re-prefills the group's whole batch
        overloaded = rate - 2.0 * err > high * mu_tp
        if state.width > 1 and (overloaded or waiting >= 3 * w):
            return _release_all(state)
        return []

    return policy


PriorityWidth = int | Literal["auto", "widest"]


def priority(p_hi: int = 1, width: PriorityWidth = "auto", busy: float = 2.0,
             saturated: float = 4.0, dwell_s: float = 2.0, mu_tp: float | None = None,
             high: float = 0.8, rate_window_s: float = 5.0, confidence: float = 2.0
             ) -> SwitchPolicy:
    """A request of priority >= p_hi hard-preempts an aligned group; released once no such
    request runs or waits. `width` "auto" sizes the group by the backlog b (requests waiting
    per engine) and the arrival rate: b < `busy` and the rate under `high` x `mu_tp` (the
    widest group's service rate at a full batch, requests/s; None: not checked): the widest
    (every request then runs on it, and it keeps up: TP for the priority request costs no
    throughput; a continuous batcher admits a flood into its batch, so the rate shows an
    overload that the queue does not; narrowing a bound group on the rate needs it two
    standard errors above, as in `hysteresis`); `busy` <= b < `saturated`: the narrowest wider
    than one engine (the others keep serving DP); b >= `saturated`: no group (every engine's
    throughput is needed; priority requests jump the DP queues instead). A bound group wider
    than the current choice is released once `dwell_s` has passed since the last change, and
    the narrower group bound in the same step (observed after the release, the requests it
    folds back would read as a backlog). An int or "widest" fixes the width."""

    if not (width in ("auto", "widest") or (isinstance(width, int) and width > 1
                                              and not width & (width - 1))):
        raise ValueError(f"priority width must be 'auto', 'widest' or a power of two > 1, "
                         f"not {width!r}")
    if not 0 < busy <= saturated:
        raise ValueError("need 0 < busy <= saturated")

    def choose(state: SwitchState, margin: float = 0.0) -> int:
        wider = sorted(w for w in state.widths if w > 1 and state.n % w == 0)
        if not wider:
            return 1
        if width == "widest":
            return wider[-1]
        if width != "auto":
            return width if width in wider else 1
        backlog = sum(state.waiting) / state.n
        rate, err = rate_bounds(state, rate_window_s)
        keeps_up = mu_tp is None or rate - margin * err < high * mu_tp
        if backlog < busy and keeps_up:
            return wider[-1]
        return wider[0] if backlog < saturated else 1

    def bind(state: SwitchState, want: int) -> list[Action]:
        """Bind the aligned group of `want` engines that holds the least work."""
        groups = [segment(k * want, want) for k in range(state.n // want)]
        g = min(groups, key=lambda g: (sum(state.waiting[e] + state.running[e] for e in g), g))
        return [Bind(g, "hard")]

    def policy(state: SwitchState) -> list[Action]:
        urgent = any(p.priority >= p_hi for p in state.pending)
        want = choose(state, confidence if state.width > 1 else 0.0)
        if state.width > 1:
            if not urgent and state.running_priority < p_hi:
                return _release_all(state)
            if want < state.width and state.now - state.mode_since >= dwell_s:
                return _release_all(state) + (bind(state, want) if want > 1 else [])
            return []
        return bind(state, want) if urgent and want > 1 else []

    return policy


def fits_width(tokens: int, free_kv: Sequence[int], group: Sequence[int]) -> bool:
    return sum(free_kv[e] for e in group) >= tokens


def context_length(method: Method = "hard") -> SwitchPolicy:
    """Bind the smallest aligned group whose pooled free KV holds the head request (prompt +
    output) when no single engine can; release when no wide request runs or waits. A request
    that fits one engine's free KV never causes a bind."""

    def policy(state: SwitchState) -> list[Action]:
        need = [p for p in state.pending if not any(f >= p.tokens for f in state.free_kv)]
        if not need:
            if state.width > 1 and state.running_wide == 0:
                return _release_all(state)
            return []
        head = need[0]
        for w in sorted(x for x in state.widths if x > 1 and state.n % x == 0):
            groups = [segment(k * w, w) for k in range(state.n // w)]
            for g in sorted(groups, key=lambda g: (head.engine not in g, g)):
                if not fits_width(head.tokens, state.free_kv, g):
                    continue
                if g in state.groups:
                    return []
                return [*(Release(b) for b in _bound(state) if set(b) & set(g)),
                        Bind(g, method)]
        return []

    return policy


def scheduled(times: Sequence[tuple[float, int]] = (), method: Method = "hard") -> SwitchPolicy:
    """Oracle switch times: at each (t, width) the engines move to that width (Fig. 8 runs)."""
    plan = sorted(times)

    def policy(state: SwitchState) -> list[Action]:
        due = [w for t, w in plan if t <= state.now]
        if not due:
            return []
        return actions_for_width(state, due[-1], method)

    return policy


SWITCH_POLICIES: dict[str, Callable[..., SwitchPolicy]] = {
    "load_threshold": load_threshold,
    "hysteresis": hysteresis,
    "priority": priority,
    "context_length": context_length,
    "scheduled": scheduled,
}


def make_policy(name: str, **options: object) -> SwitchPolicy:
    try:
        factory = SWITCH_POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown switch policy {name!r}; one of "
                         f"{', '.join(sorted(SWITCH_POLICIES))}") from None
    return factory(**options)


def min_width(tokens: int, per_engine_tokens: int, widths: Sequence[int]) -> int | None:
    """Smallest allowed width whose pooled KV (per-engine capacity x W) holds `tokens`."""
    for w in sorted(widths):
        if tokens <= per_engine_tokens * w:
            return w
    return None


def ewma_rate(prev: float, dt: float, arrivals: int, tau_s: float = 5.0) -> float:
    """Exponentially weighted arrival rate over a `tau_s` window (requests/s)."""
    if dt <= 0:
        return prev
    a = 1.0 - math.exp(-dt / tau_s)
    return prev + a * (arrivals / dt - prev)


def rate_bounds(state: SwitchState, tau_s: float = 5.0) -> tuple[float, float]:
    """The arrival rate and one standard error, from the EWMA in `state` (`ewma_rate` over
    `tau_s`, started at 0 when the engine started): divided by 1 - exp(-t / tau) so that it
    is unbiased in the first seconds; for a Poisson stream of rate r its variance is then
    r / 2 tau x (1 + exp(-t / tau)) / (1 - exp(-t / tau))."""
    seen = -math.expm1(-state.now / tau_s)  # 1 - exp(-t / tau), exact for small t
    if seen <= 1e-9:  # (almost) no history yet: the raw estimate, unbounded error
        return max(state.arrival_rate, 0.0), math.inf
    rate = max(state.arrival_rate, 0.0) / seen
    return rate, math.sqrt(rate / (2.0 * tau_s) * (2.0 - seen) / seen)
