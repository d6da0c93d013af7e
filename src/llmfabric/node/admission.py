"""The node's admission credential from its configuration, and the forward token derived
from a network secret."""

from __future__ import annotations

import hashlib
import hmac

from llmfabric.identity import Admission, CertAdmission, MembershipCert, PskAdmission
from llmfabric.identity.admission import decode_public_key
from llmfabric.node.config import ConfigError, NodeConfig


def admission_from_config(config: NodeConfig) -> Admission:
    """PSK when a network secret is set, else an operator-signed membership certificate."""
    if config.network_secret:
        return PskAdmission(config.network, config.network_secret.encode())
    if config.membership_cert is not None:
        if not config.operator_key:
            raise ConfigError(
                "--membership-cert needs --operator-key (the operator's public key, as printed "
                "by `llmfabric keys operator-init`) to check other nodes' certificates"
            )
        cert = MembershipCert.load(config.membership_cert)
        return CertAdmission(decode_public_key(config.operator_key), cert)
    raise ConfigError("no admission credential: set --network-secret or --membership-cert")


def forward_token(network_secret: str) -> str:
    """Token nodes of one PSK network accept on their HTTP engine-proxy route."""
    return hmac.new(network_secret.encode(), b"llmfabric-forward-v1", hashlib.sha256).hexdigest()
