"""SDK (openai, anthropic) and other keep-alive clients that tests make in passing, closed
after each test by the autouse fixture in conftest.py. An unclosed client keeps its pooled
sockets open until the garbage collector finds it, which may be during a later test that
turns ResourceWarning into an error (test_net_*, test_link_service)."""

from __future__ import annotations

from typing import Protocol, TypeVar


class _Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)

_open: list[_Closable] = []


def tracked(client: C) -> C:
    """`client`, to be closed when the current test ends."""
    _open.append(client)
    return client


def close_tracked() -> None:
    while _open:
        _open.pop().close()
