"""`llmfabric ingress` as a subprocess with two SO_REUSEPORT workers, in front of a backend."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

from llmfabric.cli.ingress import parse_backend
from llmfabric.ingress.errors import ConfigError
from llmfabric.net.ports import free_port

from .test_ingress_support import Backend, models_once_up, serve, stop_group

MSG: list[Any] = [{"role": "user", "content": "hi"}]


def test_backend_spec_parsing() -> None:
    b = parse_backend("llama=http://127.0.0.1:8000@uni-a#H100")
    assert (b.model, b.addr, b.provider, b.gpu) == ("llama", "127.0.0.1:8000", "uni-a", "H100")
    assert parse_backend("m=localhost:9").provider == "local"
    for bad in ("m", "m=", "=h:1", "m=host", "m=host:port"):
        with pytest.raises(ConfigError):
            parse_backend(bad)


async def test_standalone_ingress_with_two_workers(tmp_path: Path) -> None:
    bport, iport = free_port(), free_port()
    runner = await serve(Backend("A").app(), bport)
    log = (tmp_path / "ingress.log").open("wb")
    proc = subprocess.Popen(  # noqa: ASYNC220 (starting is quick; we never block on it)
        [sys.executable, "-c", "from llmfabric.cli.main import main; main()", "ingress",
         "--port", str(iport), "--backend", f"m=127.0.0.1:{bport}@uni-a#H100", "--no-auth",
         "--workers", "2"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        c = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{iport}/v1", api_key="x",
                               max_retries=0, timeout=10)
        models = await models_once_up(c, proc)
        assert [m.id for m in models.data] == ["m"]
        replies = await asyncio.gather(
            *(c.chat.completions.create(model="m", messages=MSG) for _ in range(8))
        )
        assert {r.choices[0].message.content for r in replies} == {"hello from A"}
        with pytest.raises(openai.NotFoundError):
            await c.chat.completions.create(model="zz", messages=MSG)
        r = await c.responses.create(model="m", input="hi")  # translated to chat
        assert r.output_text == "hello from A" and r.store is False
        await c.close()
    finally:
        stop_group(proc)
        log.close()
        await runner.cleanup()
    assert proc.returncode == 0, (tmp_path / "ingress.log").read_text()


def test_native_responses_needs_backends() -> None:
    from click.testing import CliRunner

    from llmfabric.cli.ingress import command

    out = CliRunner().invoke(command, ["--network-secret", "s", "--native-responses", "m"])
    assert out.exit_code == 2 and "--native-responses applies to --backend" in out.output
