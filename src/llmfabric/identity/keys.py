"""Ed25519 node keys: generate on first use, persist with 0600 permissions, sign and verify.

The default home is ``~/.llmfabric`` (override with the ``LLMFABRIC_HOME`` environment variable
or an explicit directory). The node key lives in ``node.key`` and an operator key (used to
sign membership certificates) in ``operator.key``, both as unencrypted PKCS#8 PEM.
"""

from __future__ import annotations

import os
import pathlib
import stat

from cryptography.exceptions import InvalidSignature as _CryptoInvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from llmfabric.identity.errors import InvalidSignature, KeyFileError
from llmfabric.identity.peer_id import peer_id_from_public_key
from llmfabric.untrusted import get_logger

log = get_logger(__name__)

NODE_KEY_FILE = "node.key"
OPERATOR_KEY_FILE = "operator.key"


def default_home(home: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """The llmfabric state directory: `home`, else $LLMFABRIC_HOME, else ~/.llmfabric."""
    if home is not None:
        return pathlib.Path(home)
    env = os.environ.get("LLMFABRIC_HOME")
    if env:
        return pathlib.Path(env)
    return pathlib.Path.home() / ".llmfabric"


class NodeKey:
    """An Ed25519 private key with its peer id. Also used for operator keys."""

    __slots__ = ("_peer_id", "_private", "_public_raw")

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        self._public_raw = private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self._peer_id = peer_id_from_public_key(self._public_raw)

    @classmethod
    def generate(cls) -> NodeKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_pem(cls, pem: bytes) -> NodeKey:
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError) as exc:
            raise KeyFileError(f"not a PEM private key: {exc}") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise KeyFileError(
                "the key is not an Ed25519 key; generate one with `llmfabric keys init`"
            )
        return cls(key)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> NodeKey:
        p = pathlib.Path(path)
        try:
            # Check the file we read (fstat on its descriptor), not the path: in a directory
            # another user can write, the file could be swapped between a check and a read.
            # (O_NONBLOCK: a FIFO planted there must not hang the open.)
            fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as fh:
                st = os.fstat(fh.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise KeyFileError(f"key file {p} is not a regular file")
                if st.st_uid not in (os.geteuid(), 0):  # (planted in a shared directory)
                    raise KeyFileError(f"key file {p} belongs to another user (uid "
                                       f"{st.st_uid}); a node uses only its own key")
                if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                    raise KeyFileError(
                        f"key file {p} is readable by others (mode {oct(st.st_mode & 0o777)}); "
                        f"run chmod 600 {p}"
                    )
                pem = fh.read(1 << 16)  # a PEM Ed25519 key is 119 bytes
        except OSError as exc:
            raise KeyFileError(f"cannot read key file {p}: {exc}") from exc
        return cls.from_pem(pem)

    @classmethod
    def load_or_create(
        cls, home: str | os.PathLike[str] | None = None, filename: str = NODE_KEY_FILE
    ) -> tuple[NodeKey, bool]:
        """Load `<home>/<filename>`, creating it (0600, dir 0700) if absent; (key, created).
        The directory must be ours (or root's), and so must the key in it."""
        directory = default_home(home)
        path = directory / filename
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        _check_home(directory)
        if path.exists():
            return cls.load(path), False
        key = cls.generate()
        key.save(path)
        return key, True

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the key as PEM with mode 0600; fails if the file already exists."""
        p = pathlib.Path(path)
        try:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError as exc:
            raise KeyFileError(f"{p} already exists; refusing to overwrite a key") from exc
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o600)  # (the descriptor: the path may be swapped by now)
            fh.write(self.private_pem())

    def private_pem(self) -> bytes:
        return self._private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    @property
    def private_key(self) -> Ed25519PrivateKey:
        return self._private

    @property
    def public_bytes(self) -> bytes:
        """The raw 32-byte public key."""
        return self._public_raw

    @property
    def peer_id(self) -> str:
        return self._peer_id

    def sign(self, message: bytes) -> bytes:
        return self._private.sign(message)


def _check_home(directory: pathlib.Path) -> None:
    """Refuse a state directory that another user owns: they could replace or delete the
    key and every other file in it (a predictable $LLMFABRIC_HOME under /tmp that someone
    else created first). Root-owned is trusted. A directory everyone may write is allowed
    (a Kubernetes emptyDir is 0777; so is /tmp with its sticky bit): a key planted there
    belongs to its planter, and `load` refuses it; with the sticky bit ours cannot be
    replaced; without it, anyone who can write there can delete it (warned)."""
    try:
        st = directory.stat()
    except OSError as exc:
        raise KeyFileError(f"cannot use state directory {directory}: {exc}") from exc
    if st.st_uid not in (os.geteuid(), 0):
        raise KeyFileError(f"state directory {directory} belongs to another user "
                           f"(uid {st.st_uid}); use a directory of your own")
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        log.warning("state directory %s is writable by everyone (mode %s): anyone here can "
                    "delete the node key; chmod 700 it unless it is a container's own volume",
                    directory, oct(st.st_mode & 0o7777))


def verify(public_key_raw: bytes, message: bytes, signature: bytes) -> None:
    """Raise InvalidSignature unless `signature` is `public_key_raw`'s signature of `message`."""
    try:
        Ed25519PublicKey.from_public_bytes(public_key_raw).verify(signature, message)
    except (_CryptoInvalidSignature, ValueError) as exc:
        raise InvalidSignature("signature does not verify for this public key") from exc


def is_valid(public_key_raw: bytes, message: bytes, signature: bytes) -> bool:
    try:
        verify(public_key_raw, message, signature)
    except InvalidSignature:
        return False
    return True
