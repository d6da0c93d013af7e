"""A batch's input, checked: at upload (`UploadCheck`: size, line count, line length, fed
chunk by chunk) and at batch creation (`validate_input`: every line a request of the batch's
endpoint, as OpenAI checks), and read back one request at a time (`requests_of`).

A line is one request: `{"custom_id": str (unique in the file), "method": "POST", "url":
the batch's endpoint, "body": {...with a "model" string}}`. Blank lines are skipped (at
most twice `max_lines` lines in all, blank ones included, are uploaded); line
numbers (`LineError.line`) count from 1, blank lines included, as an editor shows them.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from llmfabric.batch.limits import MAX_CUSTOM_ID_CHARS, MAX_REPORTED_ERRORS, BatchLimits

MAX_BODY_DEPTH = 254  # the deepest JSON orjson writes (a line's body is sent re-encoded)


class UploadRefused(Exception):
    """An upload past a cap: `status` (400 or 413), message, code."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


class UploadCheck:
    """Counts an upload's lines as its chunks arrive and refuses it at the first cap passed
    (the whole file, the number of lines, one line's length)."""

    def __init__(self, limits: BatchLimits) -> None:
        self.limits = limits
        self.size = 0
        self.lines = 0  # non-blank lines ended so far
        self._line_len = 0  # bytes of the line being read
        self._line_blank = True
        self._ended = 0  # physical lines ended so far

    def feed(self, chunk: bytes) -> None:
        lim = self.limits
        self.size += len(chunk)
        if self.size > lim.max_file_bytes:
            raise UploadRefused(413, f"the file is larger than this ingress's limit of "
                                f"{lim.max_file_bytes} bytes", "file_too_large")
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            self._line_len += len(piece)
            if self._line_blank and piece.strip():
                self._line_blank = False
            if self._line_len > lim.max_line_bytes:
                raise UploadRefused(413, f"line {self._physical()} is longer than "
                                    f"{lim.max_line_bytes} bytes (the ingress's request body "
                                    "limit)", "line_too_large")
            if end < 0:
                return
            self._end_line()
            start = end + 1

    def finish(self) -> int:
        """The number of (non-blank) lines; refuses an empty file."""
        if self._line_len:
            self._end_line()
        if self.lines == 0:
            raise UploadRefused(400, "the file has no lines: a batch input is JSONL, one "
                                "request per line", "empty_file")
        return self.lines

    def _physical(self) -> int:
        return self._ended + 1

    def _end_line(self) -> None:
        self._ended += 1
        if self._ended > 2 * self.limits.max_lines:  # (blank lines cost a turn each too)
            raise UploadRefused(400, f"the file has more than {2 * self.limits.max_lines} "
                                "lines, blank ones included", "too_many_lines")
        if not self._line_blank:
            self.lines += 1
            if self.lines > self.limits.max_lines:
                raise UploadRefused(400, f"the file has more than {self.limits.max_lines} "
                                    "requests, the most one batch takes; split it",
                                    "too_many_lines")
        self._line_len, self._line_blank = 0, True


@dataclass(frozen=True, slots=True)
class LineError:
    line: int  # from 1
    code: str
    message: str
    param: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param,
                "line": self.line}


@dataclass(frozen=True, slots=True)
class BatchLine:
    index: int  # physical line, from 0 (the runner's key for the line's result)
    custom_id: str
    body: dict[str, Any]


def parse_line(raw: bytes, index: int, endpoint: str) -> BatchLine | LineError:
    """One input line as a request of `endpoint`, or why it is not one."""
    n = index + 1
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return LineError(n, "invalid_json_line", f"line {n} is not valid JSON")
    if not isinstance(doc, dict):
        return LineError(n, "invalid_request", f"line {n} is not a JSON object")
    cid = doc.get("custom_id")
    if not isinstance(cid, str) or not cid or len(cid) > MAX_CUSTOM_ID_CHARS:
        return LineError(n, "invalid_request", f"line {n}: 'custom_id' must be a string of 1 "
                         f"to {MAX_CUSTOM_ID_CHARS} characters", "custom_id")
    if doc.get("method") != "POST":
        return LineError(n, "invalid_request", f"line {n}: 'method' must be \"POST\"",
                         "method")
    if doc.get("url") != endpoint:
        return LineError(n, "invalid_url", f"line {n}: 'url' must be the batch's endpoint "
                         f"{endpoint!r}", "url")
    body = doc.get("body")
    if not isinstance(body, dict):
        return LineError(n, "invalid_request", f"line {n}: 'body' must be a JSON object",
                         "body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return LineError(n, "missing_required_parameter",
                         f"line {n}: 'body.model' is required (a string)", "body.model")
    return BatchLine(index, cid, body)


def raw_lines(path: pathlib.Path) -> Iterator[tuple[int, bytes]]:
    """(physical index, bytes) of each non-blank line of a stored file."""
    with path.open("rb") as f:
        for index, raw in enumerate(f):
            if raw.strip():
                yield index, raw


@dataclass(frozen=True, slots=True)
class Validation:
    total: int  # requests (non-blank lines)
    errors: tuple[LineError, ...]  # the first MAX_REPORTED_ERRORS
    error_count: int


def validate_input(lines: Iterable[tuple[int, bytes]], endpoint: str, limits: BatchLimits
                   ) -> Validation:
    """Every line checked (parse_line, unique custom_id, the caps again: a file uploaded
    under larger caps is held to today's)."""
    errors: list[LineError] = []
    count = 0
    seen: set[str] = set()
    total = 0

    def bad(err: LineError) -> None:
        nonlocal count
        count += 1
        if len(errors) < MAX_REPORTED_ERRORS:
            errors.append(err)

    for index, raw in lines:
        total += 1
        if total > limits.max_lines:
            bad(LineError(index + 1, "too_many_lines", f"the file has more than "
                          f"{limits.max_lines} requests, the most one batch takes"))
            break
        # (its bytes without the newline, as UploadCheck measures it: a line of exactly the
        # cap is taken at upload and here)
        if len(raw) - raw.endswith(b"\n") > limits.max_line_bytes:
            bad(LineError(index + 1, "line_too_large", f"line {index + 1} is longer than "
                          f"{limits.max_line_bytes} bytes"))
            continue
        got = parse_line(raw, index, endpoint)
        if isinstance(got, LineError):
            bad(got)
        elif not _sendable(got.body):
            bad(LineError(index + 1, "invalid_request", f"line {index + 1}: 'body' nests "
                          f"deeper than {MAX_BODY_DEPTH} levels", "body"))
        elif got.custom_id in seen:
            bad(LineError(index + 1, "duplicate_custom_id", f"line {index + 1}: custom_id "
                          f"{got.custom_id[:64]!r} is used by an earlier line", "custom_id"))
        else:
            seen.add(got.custom_id)
    if total == 0:
        bad(LineError(1, "empty_file", "the input file has no requests"))
    return Validation(total, tuple(errors), count)


def _sendable(body: dict[str, Any]) -> bool:
    """Whether a line's body can be sent (`lines.request_body`): orjson reads JSON nested
    1,024 levels but writes only MAX_BODY_DEPTH, so a deeper body passed validation and
    then failed every try to send it as the ingress's own `internal_error`."""
    try:
        orjson.dumps(body)
    except TypeError:
        return False
    return True


def requests_of(path: pathlib.Path, endpoint: str, skip: set[int]) -> Iterator[BatchLine]:
    """The file's requests (validated before), less the lines in `skip` (answered)."""
    for index, raw in raw_lines(path):
        if index in skip:
            continue
        got = parse_line(raw, index, endpoint)
        if isinstance(got, BatchLine):
            yield got
