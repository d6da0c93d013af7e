"""Errors of the registry package. Messages say what to do."""

from __future__ import annotations


class RegistryError(Exception):
    """Base class for registry failures."""


class InvalidRecord(RegistryError):
    """A signed record or fact failed decoding, signature or peer-id checks; drop it."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class NotOwner(RegistryError):
    """Only the owner of a session may write its record; sign with the session's node key."""
