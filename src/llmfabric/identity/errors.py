"""Errors of the identity package. Messages say what to do."""

from __future__ import annotations


class IdentityError(Exception):
    """Base class for node key, signature and admission failures."""


class KeyFileError(IdentityError):
    """A key file is missing, unreadable, malformed or has unsafe permissions."""


class InvalidSignature(IdentityError):
    """A signature does not verify against the claimed public key."""


class InvalidPeerId(IdentityError):
    """A peer id string is malformed or does not derive from the presented public key."""


class AdmissionError(IdentityError):
    """A network admission credential is missing, invalid, expired or for another network."""


class CertificateRevoked(AdmissionError):
    """The peer's key or certificate is on the operator's revocation list."""
