"""`llmfabric engine sim --flying` as a real subprocess: /dtp_status and /dtp_switch show and
change the width while the OpenAI API keeps serving."""

from __future__ import annotations

import json
import pathlib
import sys
import urllib.error
import urllib.request

import openai
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _sim_engine_proc import running_engine

from ._sdk_clients import tracked

pytestmark = pytest.mark.integration


def _get(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def _post(url: str, body: object) -> dict[str, object]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def test_flying_sim_engine_switches_width(tmp_path: pathlib.Path) -> None:
    with running_engine(tmp_path / "e.log", "--dp", "2", "--flying", "--widths", "1,2") as (
            base, _):
        assert _get(f"{base}/dtp_status")["width"] == 1
        st = _post(f"{base}/dtp_switch", {"width": 2, "method": "hard-preempt"})
        assert st["width"] == 2 and st["groups"] == [[0, 1]] and st["switches"] == 1
        client = tracked(openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0))
        out = client.completions.create(model="llama-3.1-8b", prompt="hi", max_tokens=5)
        assert out.usage is not None and out.usage.completion_tokens == 5
        run = _get(f"{base}/dtp_status")["running_tp"]
        assert isinstance(run, dict) and "0-1" in run
        assert _post(f"{base}/dtp_switch", {"width": 1})["width"] == 1
        with pytest.raises(urllib.error.HTTPError) as err:
            _post(f"{base}/dtp_switch", {"width": 3})
        assert err.value.code == 400
        err.value.close()  # (an HTTPError holds the response and its socket)
