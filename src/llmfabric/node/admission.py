"""The node's admission credential from its configuration, and the provider verifier that
binds registry records to the identities routing allowlists match (registry.provider)."""

from __future__ import annotations

from collections.abc import Callable

from llmfabric.identity import Admission, CertAdmission, MembershipCert, PskAdmission
from llmfabric.identity.admission import decode_public_key
from llmfabric.node.config import ConfigError, NodeConfig
from llmfabric.registry.provider import CertRecordPolicy, ProviderVerifier


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


def provider_verifier(config: NodeConfig, wall: Callable[[], float]) -> ProviderVerifier:
    """Certificates checked against the operator key on certificate networks; on PSK
    networks (no operator key) a provider is its key fingerprint."""
    operator = (decode_public_key(config.operator_key)
                if config.membership_cert is not None and config.operator_key
                and not config.network_secret else None)
    return ProviderVerifier(operator, config.network, wall)


def record_policy(verifier: ProviderVerifier) -> CertRecordPolicy | None:
    """Records must carry a valid certificate only on certificate networks."""
    return CertRecordPolicy(verifier) if verifier.operator_key is not None else None


def own_certificate(config: NodeConfig) -> str:
    """Our membership certificate (JSON) to publish in our record; "" on PSK networks."""
    if config.membership_cert is None or config.network_secret:
        return ""
    return MembershipCert.load(config.membership_cert).to_json()
