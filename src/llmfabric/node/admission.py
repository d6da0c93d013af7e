"""The node's admission credential from its configuration, and the provider verifier that
binds registry records to the identities routing allowlists match (registry.provider)."""

from __future__ import annotations

import os
import pathlib
import stat
from collections.abc import Callable

from llmfabric.identity import Admission, CertAdmission, MembershipCert, PskAdmission
from llmfabric.identity.admission import decode_public_key
from llmfabric.identity.revocation import Revocations
from llmfabric.node.config import ConfigError, NodeConfig
from llmfabric.registry.provider import CertRecordPolicy, ProviderVerifier

_SECRET_FILE_MAX = 64 * 1024  # two secrets; a larger file is not one


def revocations_from_config(config: NodeConfig) -> Revocations | None:
    """The revocation list holder on certificate networks (empty until a list is read from
    --revocation-list or the state directory, or learnt from a peer, and followed:
    node/revocations.py); None on pre-shared-secret networks, where --revocation-list is
    refused."""
    operator = config.operator_key
    if (config.membership_cert is None or not operator or config.network_secret
            or config.network_secret_file is not None):
        if config.revocation_list is not None:
            raise ConfigError(
                "--revocation-list needs a certificate network (--membership-cert with "
                "--operator-key): on a pre-shared-secret network anyone with the secret "
                "mints keys, so rotate the secret instead")
        return None
    return Revocations(decode_public_key(operator), config.network)


def admission_from_config(config: NodeConfig,
                          revocations: Revocations | None = None) -> Admission:
    """PSK when a network secret is set, else an operator-signed membership certificate
    (checked against `revocations` when set)."""
    if config.network_secret_file is not None:
        secret, previous = read_secret_file(config.network_secret_file)
        return PskAdmission(config.network, secret, previous)
    if config.network_secret:
        prev = config.network_secret_previous
        return PskAdmission(config.network, config.network_secret.encode(),
                            prev.encode() if prev else None)
    if config.membership_cert is not None:
        if not config.operator_key:
            raise ConfigError(
                "--membership-cert needs --operator-key (the operator's public key, as printed "
                "by `llmfabric keys operator-init`) to check other nodes' certificates"
            )
        cert = MembershipCert.load(config.membership_cert)
        return CertAdmission(decode_public_key(config.operator_key), cert, revocations)
    raise ConfigError("no admission credential: set --network-secret or --membership-cert")


def read_secret_file(path: pathlib.Path) -> tuple[bytes, bytes | None]:
    """(secret, previous or None) from a file: line 1 the secret, optional line 2 the
    previous secret (still accepted during a rotation). Refused when others can read it, when
    another user owns it, or when it is not a regular file.

    The file is opened once and the checks run on the open descriptor (fstat), then the
    secret is read from that descriptor: checking the path and then reading it let a file
    swapped in between be read. Symlinks are followed (a Kubernetes secret volume is one);
    what is checked is the file read. O_NONBLOCK: a FIFO planted there must not hang us."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ConfigError(f"the network secret file {path} is not a regular file")
            if st.st_uid not in (os.geteuid(), 0):
                raise ConfigError(f"the network secret file {path} belongs to another user "
                                  f"(uid {st.st_uid}): use a file of your own")
            if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise ConfigError(
                    f"the network secret file {path} is readable by others: chmod 600 it")
            data = fh.read(_SECRET_FILE_MAX + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read the network secret file {path}: {exc.strerror}") from exc
    if len(data) > _SECRET_FILE_MAX:
        raise ConfigError(f"the network secret file {path} is over {_SECRET_FILE_MAX} bytes")
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"the network secret file {path} is not UTF-8 text") from exc
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines or len(lines) > 2:
        raise ConfigError(f"{path}: put the network secret on line 1 and, during a rotation, "
                          "the previous one on line 2")
    return lines[0].encode(), lines[1].encode() if len(lines) == 2 else None


def provider_verifier(config: NodeConfig, wall: Callable[[], float],
                      revocations: Revocations | None = None) -> ProviderVerifier:
    """Certificates checked against the operator key (and `revocations`) on certificate
    networks; on PSK networks (no operator key) a provider is its key fingerprint."""
    operator = (decode_public_key(config.operator_key)
                if config.membership_cert is not None and config.operator_key
                and not config.network_secret else None)
    return ProviderVerifier(operator, config.network, wall, revocations)


def record_policy(verifier: ProviderVerifier) -> CertRecordPolicy | None:
    """Records must carry a valid certificate only on certificate networks."""
    return CertRecordPolicy(verifier) if verifier.operator_key is not None else None


def own_certificate(config: NodeConfig) -> str:
    """Our membership certificate (JSON) to publish in our record; "" on PSK networks."""
    if config.membership_cert is None or config.network_secret:
        return ""
    return MembershipCert.load(config.membership_cert).to_json()
