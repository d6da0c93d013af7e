"""The agent's exception hierarchy. Messages say what to check or change."""

from __future__ import annotations


class AgentError(Exception):
    """Base class of every error raised by llmfabric.agent."""


class EngineCommandError(AgentError):
    """The engine command is empty or its URL cannot be worked out (pass --engine-url)."""


class EngineStartError(AgentError):
    """The engine exited, or logged a fatal error, before it became ready."""


class EngineNotReady(AgentError):
    """The engine did not answer /v1/models within the readiness timeout."""


class Draining(AgentError):
    """The node is draining and takes no new requests (answer 503 and let the ingress retry)."""
