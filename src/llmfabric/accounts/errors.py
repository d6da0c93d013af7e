"""The accounts exception hierarchy. Messages say what the caller can do about it."""

from __future__ import annotations


class AccountsError(Exception):
    """Base class of every error raised by llmfabric.accounts."""


class KeyNotFound(AccountsError):
    """No API key with that id exists."""


class PermissionDenied(AccountsError):
    """The calling key may not do this (only admins act on other owners' keys)."""


class InvalidRequest(AccountsError):
    """A bad argument (empty name, negative limit, malformed key id)."""


class BackendUnavailable(AccountsError):
    """The database cannot be used: its driver is not installed or its server cannot be
    reached (a wrong URL, or the server is down)."""


class RateLimited(AccountsError):
    """The key exceeded its requests/min or tokens/min limit; retry after `retry_after_s`."""

    def __init__(self, retry_after_s: float, limit: str) -> None:
        self.retry_after_s = max(0.0, retry_after_s)
        self.limit = limit
        super().__init__(
            f"rate limit exceeded ({limit}); retry after {self.retry_after_s:.1f} s "
            "or ask an admin to raise the key's limit"
        )
