"""Misbehaviour the simulated engine can be told to show, for tests of the agent and ingress.

Through `POST /sim/control` (JSON) or CLI flags at start:
  {"action": "crash", "code": 3}            exit at once with that status (default 3)
  {"action": "hang"}                        stop answering everything except /sim/control,
                                            /health included, and stop producing tokens
  {"action": "slow", "factor": F}           every prefill and decode step takes F times longer
  {"action": "fail", "status": 500,         answer inference requests with that error status;
   "health": false}                         "health": true makes /health and /v1/models fail too
  {"action": "log", "line": "..."}          print a line to stdout (fatal-pattern tests)
  {"action": "reset"}                       undo hang/slow/fail
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass, field


@dataclass(slots=True)
class FaultState:
    fail_status: int = 0
    fail_health: bool = False
    crash_after_requests: int = 0  # 0: never
    hang_after_requests: int = 0
    fail_after_requests: int = 0
    fail_after_status: int = 500
    requests: int = 0
    _resumed: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._resumed.set()

    @property
    def hung(self) -> bool:
        return not self._resumed.is_set()

    def hang(self) -> None:
        self._resumed.clear()

    def resume(self) -> None:
        self._resumed.set()

    async def wait_while_hung(self) -> None:
        await self._resumed.wait()

    def count_request(self) -> None:
        """Count an inference request and trigger the after-N-requests faults."""
        self.requests += 1
        if self.crash_after_requests and self.requests > self.crash_after_requests:
            crash(3, f"crash after {self.crash_after_requests} requests")
        if self.hang_after_requests and self.requests > self.hang_after_requests:
            self.hang()
        if self.fail_after_requests and self.requests > self.fail_after_requests:
            self.fail_status = self.fail_after_status


def crash(code: int, why: str) -> None:
    print(f"ERROR: simulated engine crash ({why}); exiting with status {code}", flush=True)
    sys.stderr.flush()
    os._exit(code)
