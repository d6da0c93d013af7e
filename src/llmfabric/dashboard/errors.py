"""The dashboard exception hierarchy. Messages say what the caller can do about it."""

from __future__ import annotations


class DashboardError(Exception):
    """Base class of every error raised by llmfabric.dashboard."""


class AssetsMissing(DashboardError):
    """The static bundle is not installed with the package."""

    def __init__(self, where: str) -> None:
        super().__init__(
            f"dashboard assets not found at {where}; reinstall llmfabric "
            "(pip install -e .) so its package data (html/js/css) is included"
        )


class InvalidPrefix(DashboardError):
    """The mount prefix is not of the form '/name'."""
