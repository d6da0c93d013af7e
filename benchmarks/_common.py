"""Tiny helpers shared by benchmark scripts: write `--json OUT` and a markdown table beside it,
percentiles, this process's RSS, and a closed-loop HTTP/1.1 client with its response-head
parser."""

from __future__ import annotations

import asyncio
import json
import math
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
                   floatfmt: str = ".4g") -> str:
    if not rows:
        return "(no rows)\n"
    cols = list(columns or rows[0].keys())
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in rows:
        cells = []
        for c in cols:
            v = row.get(c, "")
            cells.append(format(v, floatfmt) if isinstance(v, float) else str(v))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def write_results(out: Path | None, payload: Mapping[str, Any], title: str,
                  rows: Sequence[Mapping[str, Any]], notes: str = "",
                  columns: Sequence[str] | None = None) -> None:
    """Write `payload` as JSON to `out` and `# title` + notes + table to `out` with .md
    (stdout when `out` is None)."""
    md = f"# {title}\n\n{notes.strip()}\n\n{markdown_table(rows, columns)}"
    if out is None:
        sys.stdout.write(json.dumps(_clean(payload), indent=2) + "\n\n" + md)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_clean(payload), indent=2) + "\n")
    out.with_suffix(".md").write_text(md)


def rss_kib() -> int:
    """This process's resident memory (VmRSS), KiB; 0 where /proc does not say."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def pct(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (`q` in 0..1); NaN for no samples."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


# One request on a keep-alive connection: (HTTP status, latency s, first byte s, keep open).
Exchange = Callable[[asyncio.StreamReader, asyncio.StreamWriter],
                    Awaitable[tuple[int, float, float, bool]]]


async def closed_loop(port: int, concurrency: int, exchange: Exchange,
                      more: Callable[[], bool]) -> tuple[list[tuple[float, float]], int]:
    """`concurrency` clients on 127.0.0.1:`port`, each sending `exchange` back to back on one
    keep-alive connection (reopened after an error or a close) while `more()`. Returns
    (latency, first byte) of every 200 answer and the number of errors."""
    ok: list[tuple[float, float]] = []
    errors = 0

    async def client() -> None:
        nonlocal errors
        reader: asyncio.StreamReader | None = None
        writer: asyncio.StreamWriter | None = None
        while more():
            try:
                if writer is None or reader is None:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                status, total, first, keep = await asyncio.wait_for(exchange(reader, writer), 30)
                if status == 200:
                    ok.append((total, first))
                else:
                    errors += 1
                if not keep:
                    writer.close()
                    writer = None
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError):
                errors += 1
                if writer is not None:
                    writer.close()
                writer = None
                await asyncio.sleep(0.01)
        if writer is not None:
            writer.close()

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return ok, errors


def parse_head(head: bytes) -> tuple[int, int | None, bool, bool]:
    """(status, Content-Length or None, chunked, keep-alive) of an HTTP/1.1 response head."""
    status = int(head[9:12])
    length, chunked, keep = None, False, True
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        k = k.strip().lower()
        if k == b"content-length":
            length = int(v)
        elif k == b"transfer-encoding" and b"chunked" in v.lower():
            chunked = True
        elif k == b"connection" and v.strip().lower() == b"close":
            keep = False
    return status, length, chunked, keep


def until(deadline: float) -> Callable[[], bool]:
    """`more` for `closed_loop`: true until time.perf_counter() reaches `deadline`."""
    return lambda: time.perf_counter() < deadline
