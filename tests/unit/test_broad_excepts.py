"""No broad except swallows a failure unseen (issue 18: "no broad excepts without a log line").

Read from the AST of src/llmfabric (nothing is imported): every handler of `Exception`,
`BaseException` or a bare `except:` must re-raise, log (a `log.`/`logger.` call or a
`log_due` gate), or say on its `except` line or the first line of its body, in a comment,
why the failure is handled there instead (e.g. "a peer's garbage: ..."). A new silent
`except Exception: pass` fails this test with its file and line.
"""

from __future__ import annotations

import ast
import io
import pathlib
import tokenize

import pytest

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "llmfabric"
BROAD = {"Exception", "BaseException"}


def _comment_lines(source: str) -> set[int]:
    return {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT}


def _is_broad(handler: ast.ExceptHandler) -> bool:
    t = handler.type
    if t is None:
        return True
    names = t.elts if isinstance(t, ast.Tuple) else [t]
    return any(isinstance(n, ast.Name) and n.id in BROAD for n in names)


def _accounts_for_it(handler: ast.ExceptHandler) -> bool:
    for node in ast.walk(handler):
        if isinstance(node, ast.Raise):
            return True
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) \
                    and f.value.id in ("log", "logger", "logging"):
                return True
            if isinstance(f, ast.Name) and f.id == "log_due":
                return True
    return False


def silent_broad_excepts(source: str, name: str = "<src>") -> list[str]:
    """`name:line` of every broad handler in `source` that neither raises, logs, nor says
    why in a comment on its except line or its body's first line."""
    unseen = [node for node in ast.walk(ast.parse(source))
              if isinstance(node, ast.ExceptHandler) and _is_broad(node)
              and not _accounts_for_it(node)]
    if not unseen:
        return []
    comments = _comment_lines(source)  # (tokenizing is the slow part: only where needed)
    return [f"{name}:{node.lineno}" for node in unseen
            if node.lineno not in comments and node.body[0].lineno not in comments]


def test_every_broad_except_in_src_raises_logs_or_says_why() -> None:
    found = []
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 100  # (the source tree was found)
    for path in files:
        found += silent_broad_excepts(path.read_text(), str(path.relative_to(SRC.parent)))
    assert found == [], "broad excepts that swallow failures unseen:\n" + "\n".join(found)


@pytest.mark.parametrize("snippet", [
    "try:\n    f()\nexcept Exception:\n    pass\n",
    "try:\n    f()\nexcept:\n    x = 1\n",
    "try:\n    f()\nexcept (ValueError, BaseException) as e:\n    g(e)\n",
])
def test_a_silent_broad_except_is_found(snippet: str) -> None:
    assert silent_broad_excepts(snippet) == ["<src>:3"]


@pytest.mark.parametrize("snippet", [
    "try:\n    f()\nexcept Exception:\n    log.error('f failed')\n",
    "try:\n    f()\nexcept Exception:\n    if log_due(n):\n        g()\n",
    "try:\n    f()\nexcept Exception as e:\n    raise Other() from e\n",
    "try:\n    f()\nexcept Exception:  # (a peer's garbage: refused below)\n    x = 1\n",
    "try:\n    f()\nexcept Exception:\n    pass  # (gone either way)\n",
    "try:\n    f()\nexcept ValueError:\n    pass\n",  # (narrow: not this test's business)
])
def test_a_broad_except_that_logs_raises_or_says_why_passes(snippet: str) -> None:
    assert silent_broad_excepts(snippet) == []
