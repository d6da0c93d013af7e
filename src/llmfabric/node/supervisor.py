"""NodeSupervisor: the one owner of a node's lifecycle (its sessions, its engine, its loops).

Structured concurrency, written out because asyncio.TaskGroup's policy (the first failure
cancels every sibling) is the wrong one for a node: a crashed background loop restarts under
its own `RestartPolicy` (bounded restarts, exponential backoff with jitter on the injected
clock), and only when its restarts are used up does the node go down, visibly (logged with
the task's name and traceback, counted in `failures`, exported as
`llmfabric_node_task_failures_total`). Every task the supervisor starts is cancelled and
awaited by `stop()`.

Sessions (GossipAgents) and the engine are replaced in ONE operation, `change_session`,
under a lock: the new session is started before it becomes current, so readers (the HTTP
views, routing, controllers) see either the old session or the started new one, never
none; the old one is closed after the swap. A session sends nothing before it is started
(GossipAgent), and nothing is awaited between its start and the swap: peers cannot hear of
the new session while this node still shows the old one. Every session and engine the supervisor was
given stays owned until closed, so `stop()` (idempotent, safe to call while a release or a
rejoin is in flight) closes all of them and leaves nothing running.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

from llmfabric.clock import Clock
from llmfabric.untrusted import get_logger

log = get_logger(__name__)


class Session(Protocol):
    """What the supervisor needs of a session (a GossipAgent)."""

    async def start(self) -> None: ...

    async def leave(self) -> None: ...

    async def aclose(self) -> None: ...


class Engine(Protocol):
    """What the supervisor needs of an engine (an EngineLink)."""

    async def aclose(self, stop_timeout_s: float | None = None) -> None: ...


S = TypeVar("S", bound=Session)
E = TypeVar("E", bound=Engine)


class SupervisorStopped(RuntimeError):
    """The node is stopping: no new sessions, engines or loops."""


class SessionChanged(RuntimeError):
    """The session changed while the caller was deciding (a release raced a restart)."""


class Keep(enum.Enum):
    KEEP = "keep"


KEEP = Keep.KEEP  # change_session(engine=KEEP): the engine stays as it is


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """Restart a failed task up to `max_restarts` times (the count starts over once it ran
    `reset_after_s` without failing), after `backoff_s * 2**(n-1)` seconds (capped, with
    +-25% jitter); one failure more takes the node down."""

    max_restarts: int = 3
    backoff_s: float = 1.0
    backoff_cap_s: float = 30.0
    reset_after_s: float = 600.0

    def delay(self, restart: int, rng: random.Random) -> float:
        base = min(self.backoff_cap_s, self.backoff_s * 2.0 ** (restart - 1))
        return base * (0.75 + 0.5 * rng.random())


RESTART = RestartPolicy()
ONE_SHOT = RestartPolicy(max_restarts=0)  # a failure takes the node down at once


class NodeSupervisor(Generic[S, E]):
    def __init__(
        self, clock: Clock, rng: random.Random, *,
        take_down: Callable[[str, BaseException], None],
    ) -> None:
        self.clock = clock
        self.rng = rng
        # Called once a task failed beyond its policy (the node sets its exit code and
        # stops; it must not await here: stop() cancels this very task).
        self._take_down = take_down
        self.failures: Counter[str] = Counter()  # task name -> failures (exported)
        self._session: S | None = None
        self._engine: E | None = None
        self._sessions: list[S] = []  # owned: started or not, closed by stop()
        self._engines: list[E] = []
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._lock = asyncio.Lock()  # one session change at a time; stop() waits for it
        self._stopping = False
        self._stop_started = False
        self._stopped = asyncio.Event()

    # ---- what readers ask -----------------------------------------------------------------
    @property
    def session(self) -> S | None:
        return self._session

    @property
    def engine(self) -> E | None:
        return self._engine

    @property
    def stopping(self) -> bool:
        return self._stopping

    def running(self) -> list[str]:
        """Names of the tasks running now (for tests and the local view)."""
        return sorted(name for name, t in self._tasks.items() if not t.done())

    # ---- sessions and the engine ----------------------------------------------------------
    async def change_session(
        self, make: Callable[[], S], *, leave_old: bool = False,
        engine: E | Keep | None = KEEP, expect: S | None = None,
        engine_stop_timeout_s: float | None = 2.0,
    ) -> S:
        """Replace the current session by `make()` (and the engine by `engine` unless KEEP),
        as one operation: stop a replaced engine still owned (before anything else, so its
        GPUs are free when the new session shows), announce LEFT for the old session if
        `leave_old`, start the new one, make it current, then close the old one.
        `expect`: refuse with SessionChanged unless it is still the current session."""
        if self._stopping:  # (before the lock too: a change in flight may hold it long)
            raise SupervisorStopped("the node is stopping")
        async with self._lock:
            if self._stopping:
                raise SupervisorStopped("the node is stopping")
            old = self._session
            if expect is not None and old is not expect:
                raise SessionChanged("the session changed meanwhile")
            replaced = self._engine
            if engine is not KEEP and replaced is not None and replaced is not engine:
                await self.close_engine(replaced, engine_stop_timeout_s)
            fresh = make()
            self._sessions.append(fresh)
            if old is not None and leave_old:
                await old.leave()
            await fresh.start()
            self._session = fresh  # the swap: readers move to the started session
            if engine is not KEEP:
                self._engine = engine
                if engine is not None:
                    self.own_engine(engine)
            if old is not None:
                await self._close_session(old)
            return fresh

    def install_engine(self, engine: E) -> None:
        """Make `engine` the node's engine (a node has at most one)."""
        if self._stopping:
            raise SupervisorStopped("the node is stopping")
        if self._engine is not None:
            raise RuntimeError("the node already has an engine")
        self._engine = engine
        self.own_engine(engine)

    def own_engine(self, engine: E) -> None:
        """Own `engine` before it starts (a restart's), so stop() stops it too."""
        if engine not in self._engines:
            self._engines.append(engine)

    async def close_engine(self, engine: E, stop_timeout_s: float | None = None) -> None:
        """Stop an owned engine (it stays the current one until a session change)."""
        if engine in self._engines:
            self._engines.remove(engine)
            await engine.aclose(stop_timeout_s)

    async def _close_session(self, session: S) -> None:
        if session in self._sessions:
            self._sessions.remove(session)
            await session.aclose()

    # ---- loops ----------------------------------------------------------------------------
    def loop(self, name: str, run: Callable[[], Awaitable[None]],
             policy: RestartPolicy = RESTART) -> None:
        """Run `run()` as the task `name` under `policy` until it returns. A name already
        running is left alone (one publisher per kind); nothing starts once stopping."""
        if self._stopping:
            log.debug("node task %s not started: stopping", name)
            return
        self._tasks = {n: t for n, t in self._tasks.items() if not t.done()}  # (finished)
        if name in self._tasks:
            return
        self._tasks[name] = asyncio.get_running_loop().create_task(
            self._supervise(name, run, policy), name=f"node-{name}")

    async def _supervise(self, name: str, run: Callable[[], Awaitable[None]],
                         policy: RestartPolicy) -> None:
        restarts = 0
        while True:
            started = self.clock.now()
            try:
                await run()
                return
            except SupervisorStopped:
                return  # (a session change refused because the node is stopping)
            except Exception as exc:
                self.failures[name] += 1
                if self.clock.now() - started >= policy.reset_after_s:
                    restarts = 0
                if restarts >= policy.max_restarts:
                    log.error("node task %s failed after %d restart(s), the most its policy "
                              "allows: taking the node down", name, restarts, exc_info=exc)
                    self._take_down(name, exc)
                    return
                restarts += 1
                delay = policy.delay(restarts, self.rng)
                log.error("node task %s failed; restart %d of %d in %.1f s", name, restarts,
                          policy.max_restarts, delay, exc_info=exc)
                await self.clock.sleep(delay)

    # ---- stop -----------------------------------------------------------------------------
    def begin_stop(self) -> bool:
        """Refuse new sessions, engines and loops from now on; False if already stopping."""
        first = not self._stopping
        self._stopping = True
        return first

    async def settled_session(self) -> S | None:
        """The current session once no session change is in flight (stop's last session)."""
        async with self._lock:
            return self._session

    async def stop(self, engine_timeout_s: float | None = None) -> None:
        """Cancel and await every task, then stop every owned engine and close every owned
        session. Idempotent: a second caller waits for the first to finish."""
        self._stopping = True
        if self._stop_started:
            await self._stopped.wait()
            return
        self._stop_started = True
        try:
            current = asyncio.current_task()
            tasks = [t for t in self._tasks.values() if t is not current]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            async with self._lock:  # a session change in flight ends first
                for engine in list(self._engines):
                    await self._closing("engine", self.close_engine(engine, engine_timeout_s))
                for session in list(self._sessions):
                    await self._closing("session", self._close_session(session))
        finally:
            self._stopped.set()

    async def _closing(self, what: str, closing: Awaitable[None]) -> None:
        """Close one thing; a failure is logged and counted, and the rest still close."""
        try:
            await closing
        except Exception:
            self.failures[f"close-{what}"] += 1
            log.exception("closing a %s failed while stopping", what)
