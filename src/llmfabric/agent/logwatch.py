"""Watch an engine's log file for fatal patterns (the node fail-stops on a match).

The engine writes its stdout/stderr to a file; the watcher reads what was appended every
`interval_s`, keeps the last lines for error messages, and reports the first line matching
any fatal regex. Defaults cover collective and CUDA failures after which vLLM/SGLang keep
running but can no longer serve correctly.
"""

from __future__ import annotations

import asyncio
import collections
import pathlib
import re
from collections.abc import Callable, Sequence

from llmfabric.clock import Clock

DEFAULT_FATAL_PATTERNS: tuple[str, ...] = (
    r"Watchdog caught collective operation timeout",
    r"NCCL.*[Tt]ime(d )?out",
    r"NCCL error",
    r"CUDA error",
    r"an illegal memory access was encountered",
    r"uncorrectable ECC error",
)


class LogWatcher:
    def __init__(
        self,
        path: pathlib.Path,
        patterns: Sequence[str],
        on_fatal: Callable[[str, str], None],
        clock: Clock,
        *,
        start_offset: int = 0,
        interval_s: float = 0.25,
        keep_lines: int = 50,
    ) -> None:
        self._path = path
        self._regexes = [re.compile(p) for p in patterns]
        self._on_fatal = on_fatal
        self._clock = clock
        self._offset = start_offset
        self._interval = interval_s
        self._partial = b""
        self.tail: collections.deque[str] = collections.deque(maxlen=keep_lines)
        self.matched: str | None = None

    def feed(self, data: bytes) -> None:
        """Process newly appended bytes (complete lines only; a partial line waits)."""
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace").rstrip("\r")
            self.tail.append(line)
            if self.matched is None:
                for rx in self._regexes:
                    if rx.search(line):
                        self.matched = line
                        self._on_fatal(line, rx.pattern)
                        break

    def _read_new(self) -> bytes:
        try:
            with self._path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return b""
        self._offset += len(data)
        return data

    async def scan(self) -> None:
        data = await asyncio.to_thread(self._read_new)
        if data:
            self.feed(data)

    async def run(self) -> None:
        while True:
            await self.scan()
            await self._clock.sleep(self._interval)
