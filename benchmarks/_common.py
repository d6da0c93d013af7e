"""Tiny helpers shared by benchmark scripts: write `--json OUT` and a markdown table beside it."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
                   floatfmt: str = ".4g") -> str:
    if not rows:
        return "(no rows)\n"
    cols = list(columns or rows[0].keys())
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in rows:
        cells = []
        for c in cols:
            v = row.get(c, "")
            cells.append(format(v, floatfmt) if isinstance(v, float) else str(v))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def write_results(out: Path | None, payload: Mapping[str, Any], title: str,
                  rows: Sequence[Mapping[str, Any]], notes: str = "",
                  columns: Sequence[str] | None = None) -> None:
    """Write `payload` as JSON to `out` and `# title` + notes + table to `out` with .md
    (stdout when `out` is None)."""
    md = f"# {title}\n\n{notes.strip()}\n\n{markdown_table(rows, columns)}"
    if out is None:
        sys.stdout.write(json.dumps(_clean(payload), indent=2) + "\n\n" + md)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_clean(payload), indent=2) + "\n")
    out.with_suffix(".md").write_text(md)
