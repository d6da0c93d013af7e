"""The admin key an ingress or demo starts with, kept in a 0600 file beside the database."""

from __future__ import annotations

import os
import pathlib

from llmfabric.accounts.models import ApiKey
from llmfabric.accounts.store import AccountStore


def fabric_home() -> pathlib.Path:
    """$LLMFABRIC_HOME, else ~/.llmfabric."""
    return pathlib.Path(os.environ.get("LLMFABRIC_HOME") or "~/.llmfabric").expanduser()


def default_db_url() -> str:
    """$LLMFABRIC_DB (a path or URL), else <fabric home>/accounts.db."""
    return os.environ.get("LLMFABRIC_DB") or str(fabric_home() / "accounts.db")


def default_admin_key_file() -> pathlib.Path:
    return fabric_home() / "admin.key"


async def ensure_admin_key(
    store: AccountStore,
    key_file: str | os.PathLike[str],
    *,
    name: str = "admin",
    owner: str = "admin",
) -> tuple[ApiKey, str]:
    """Return the admin key whose plaintext is in `key_file`, creating both if the file is
    missing or holds a key that no longer authenticates as an admin (e.g. revoked)."""
    path = _expand(key_file)
    existing = _read(path)
    if existing:
        key = await store.authenticate(existing)
        if key is not None and key.admin:
            return key, existing
    key, plaintext = await store.create_key(name, owner, admin=True, record_trace=False)
    _write_private(path, plaintext)
    return key, plaintext


def _expand(key_file: str | os.PathLike[str]) -> pathlib.Path:
    return pathlib.Path(key_file).expanduser()


def _read(path: pathlib.Path) -> str | None:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def _write_private(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)
