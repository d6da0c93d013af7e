"""A batch's input, hostile: uploads past the caps (file, line, line count), lines that
are no request of the batch's endpoint, duplicate custom ids, client file names that try to
be paths."""

from __future__ import annotations

import pathlib
from typing import Any

import orjson
import pytest

from llmfabric.batch.files_api import safe_filename
from llmfabric.batch.limits import MAX_REPORTED_ERRORS, BatchLimits
from llmfabric.batch.validate import (
    BatchLine,
    LineError,
    UploadCheck,
    UploadRefused,
    parse_line,
    raw_lines,
    validate_input,
)

pytestmark = [pytest.mark.unit, pytest.mark.hostile]
CHAT = "/v1/chat/completions"


def line(cid: Any = "a", url: str = CHAT, method: str = "POST", body: Any = None) -> bytes:
    return orjson.dumps({"custom_id": cid, "method": method, "url": url,
                         "body": {"model": "m", "messages": []} if body is None else body})


def _upload(data: bytes, limits: BatchLimits, chunk: int = 7) -> int:
    check = UploadCheck(limits)
    for i in range(0, len(data), chunk):
        check.feed(data[i:i + chunk])
    return check.finish()


def test_upload_counts_lines_across_chunks_and_skips_blank_ones() -> None:
    data = line("a") + b"\n\n  \n" + line("b") + b"\n" + line("c")  # (no final newline)
    for chunk in (1, 5, 64, 10_000):
        assert _upload(data, BatchLimits(), chunk) == 3


@pytest.mark.parametrize(("data", "limits", "status", "code"), [
    (b"x" * 101, BatchLimits(max_file_bytes=100), 413, "file_too_large"),
    (b"ok\n" + b"y" * 51 + b"\n", BatchLimits(max_line_bytes=50), 413, "line_too_large"),
    (b"\n \n", BatchLimits(), 400, "empty_file"),
    (b"", BatchLimits(), 400, "empty_file"),
    (b"{}\n" * 50_001, BatchLimits(), 400, "too_many_lines"),
])
def test_uploads_past_a_cap_are_refused(data: bytes, limits: BatchLimits, status: int,
                                        code: str) -> None:
    with pytest.raises(UploadRefused) as e:
        _upload(data, limits, chunk=65536)
    assert (e.value.status, e.value.code) == (status, code)


def test_a_long_line_is_named_by_its_number() -> None:
    with pytest.raises(UploadRefused, match="line 3 "):
        _upload(b"a\n\n" + b"z" * 20, BatchLimits(max_line_bytes=10), chunk=3)


def test_exactly_the_caps_pass() -> None:
    assert _upload(b"{}\n" * 50_000, BatchLimits(), chunk=65536) == 50_000
    assert _upload(b"z" * 10, BatchLimits(max_line_bytes=10, max_file_bytes=10)) == 1


@pytest.mark.parametrize(("raw", "code", "param"), [
    (b"{not json", "invalid_json_line", None),
    (b"[1, 2]", "invalid_request", None),
    (b'"text"', "invalid_request", None),
    (line(cid=7), "invalid_request", "custom_id"),
    (line(cid=""), "invalid_request", "custom_id"),
    (line(cid="x" * 513), "invalid_request", "custom_id"),
    (line(method="GET"), "invalid_request", "method"),
    (line(url="/v1/embeddings"), "invalid_url", "url"),
    (line(url="/v1/chat/completions/../../admin"), "invalid_url", "url"),
    (line(body=["not", "an", "object"]), "invalid_request", "body"),
    (line(body="text"), "invalid_request", "body"),
    (line(body={"messages": []}), "missing_required_parameter", "body.model"),
    (line(body={"model": 3}), "missing_required_parameter", "body.model"),
])
def test_a_line_that_is_no_request_of_the_endpoint(raw: bytes, code: str,
                                                   param: str | None) -> None:
    got = parse_line(raw, 4, CHAT)
    assert isinstance(got, LineError)
    assert (got.line, got.code, got.param) == (5, code, param)
    assert got.to_json()["line"] == 5


def test_a_good_line() -> None:
    got = parse_line(line("q1"), 0, CHAT)
    assert got == BatchLine(0, "q1", {"model": "m", "messages": []})


def test_validation_names_every_bad_line_by_number() -> None:
    lines = [(0, line("a")), (1, b"{oops"), (3, line("a")), (4, line("b", url="/v1/x")),
             (5, b"z" * 301)]
    v = validate_input(lines, CHAT, BatchLimits(max_line_bytes=300))
    assert v.total == 5 and v.error_count == 4
    assert [(e.line, e.code) for e in v.errors] == [
        (2, "invalid_json_line"), (4, "duplicate_custom_id"), (5, "invalid_url"),
        (6, "line_too_large")]


def test_validation_reports_the_first_errors_and_counts_all() -> None:
    v = validate_input(((i, b"bad") for i in range(500)), CHAT, BatchLimits())
    assert len(v.errors) == MAX_REPORTED_ERRORS and v.error_count == 500


def test_validation_holds_a_file_to_the_line_count_cap() -> None:
    v = validate_input(((i, line(str(i))) for i in range(11)), CHAT, BatchLimits(max_lines=10))
    assert [e.code for e in v.errors] == ["too_many_lines"]
    assert validate_input(iter(()), CHAT, BatchLimits()).errors[0].code == "empty_file"


@pytest.mark.parametrize(("name", "shown"), [
    ("../../etc/passwd", "passwd"), ("..\\..\\windows\\x.jsonl", "x.jsonl"),
    ("/abs/path/in.jsonl", "in.jsonl"), ("..", "upload.jsonl"), ("", "upload.jsonl"),
    (None, "upload.jsonl"), ("a\x00b\r\nc.jsonl", "abc.jsonl"), ("dir/", "upload.jsonl"),
    ("é" * 300, "é" * 255),
])
def test_a_client_file_name_is_reduced_to_a_base_name(name: str | None, shown: str) -> None:
    assert safe_filename(name) == shown


def test_a_line_of_exactly_the_cap_passes_the_upload_and_the_batch(
        tmp_path: pathlib.Path) -> None:
    # The upload measured a line without its newline, the batch's validation with it: a
    # line of exactly max_line_bytes was taken, then failed the batch.
    data = line("a") + b"\n" + line("b") + b"\n"
    cap = len(line("a"))
    limits = BatchLimits(max_line_bytes=cap)
    assert _upload(data, limits) == 2
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    assert validate_input(raw_lines(path), CHAT, limits).errors == ()
    tight = BatchLimits(max_line_bytes=cap - 1)
    with pytest.raises(UploadRefused):
        _upload(data, tight)
    assert validate_input(raw_lines(path), CHAT, tight).error_count == 2
