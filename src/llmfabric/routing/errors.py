"""The routing package's exception hierarchy."""

from __future__ import annotations


class RoutingError(Exception):
    """Base class for routing errors."""


class UnknownPolicyError(RoutingError, ValueError):
    """A policy name that is not in the registry of policies."""


class InvalidConstraintError(RoutingError, ValueError):
    """A trust or QoS constraint in a request that cannot be understood (e.g. a non-integer)."""


class InvalidSessionIdError(RoutingError, ValueError):
    """An `X-Session-Id` header that cannot be a conversation key (routing/prefix.py)."""
