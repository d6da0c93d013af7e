"""BatchStore: files and batches scoped by owner, list pages, the per-owner caps, a line
answered once (its usage counted once), and what survives a reopen (a restarted ingress,
a database from before the usage columns)."""

from __future__ import annotations

import pathlib
import sqlite3
from collections.abc import Iterator

import pytest

from llmfabric.batch.limits import BatchLimits
from llmfabric.batch.records import (
    CANCELLED,
    CANCELLING,
    COMPLETED,
    IN_PROGRESS,
    BatchRecord,
    FileRecord,
    Usage,
)
from llmfabric.batch.store import BatchStore, NotCancellable, OverCap

pytestmark = pytest.mark.unit


def _file(store: BatchStore, owner: str, size: int = 10, purpose: str = "batch") -> FileRecord:
    rec = FileRecord(store.new_file_id(), owner, "in.jsonl", purpose, size, 1, 1)
    store.path_of(rec.id).write_bytes(b"x" * size)
    store.add_file(rec)
    return rec


def _batch(store: BatchStore, owner: str, file_id: str) -> BatchRecord:
    b = BatchRecord(store.new_batch_id(), owner, "k1", "/v1/chat/completions", file_id,
                    "24h", IN_PROGRESS, 100, 100 + 86400, metadata={"a": "b"})
    store.add_batch(b)
    return b


@pytest.fixture
def store(tmp_path: pathlib.Path) -> Iterator[BatchStore]:
    s = BatchStore(tmp_path, BatchLimits(max_files_per_owner=3, max_bytes_per_owner=100))
    yield s
    s.close()


def test_files_belong_to_their_owner(store: BatchStore) -> None:
    f = _file(store, "alice")
    assert store.get_file("alice", f.id) == f
    assert store.get_file("bob", f.id) is None
    assert store.list_files("bob", None, None, 10) == ([], False)
    assert not store.delete_file("bob", f.id)
    assert store.path_of(f.id).exists()
    assert store.delete_file("alice", f.id)
    assert not store.path_of(f.id).exists() and store.get_file("alice", f.id) is None


def test_list_pages_newest_first_with_a_cursor(store: BatchStore) -> None:
    ids = [_file(store, "alice", 1).id for _ in range(3)]
    page, more = store.list_files("alice", None, None, 2)
    assert [f.id for f in page] == ids[::-1][:2] and more
    page, more = store.list_files("alice", None, page[-1].id, 2)
    assert [f.id for f in page] == [ids[0]] and not more
    assert [f.id for f in store.list_files("alice", None, None, 5, newest_first=False)[0]] == ids
    assert store.list_files("alice", "batch_output", None, 5) == ([], False)
    assert store.list_files("bob", None, ids[1], 5) == ([], False)  # another's cursor


def test_per_owner_caps(store: BatchStore) -> None:
    for _ in range(3):
        _file(store, "alice", 10)
    assert "3 files" in (store.cap_refusal("alice", 1) or "")
    with pytest.raises(OverCap):
        _file(store, "alice", 1)
    assert store.cap_refusal("bob", 100) is None
    assert "bytes" in (store.cap_refusal("bob", 101) or "")
    # batch outputs are the runner's: not counted, never refused
    store.add_file(FileRecord(store.new_file_id(), "alice", "o", "batch_output", 500, 1, 1),
                   capped=False)
    assert store.owner_usage("alice") == (3, 30)


@pytest.mark.parametrize("bogus", ["../batch.db", "file-../../etc/passwd", "file-XYZ", "",
                                   "file-" + "0" * 23, "/etc/passwd"])
def test_a_path_is_only_ever_one_of_our_ids(store: BatchStore, bogus: str) -> None:
    with pytest.raises(ValueError):
        store.path_of(bogus)


def test_batches_owner_scoped_and_cancel(store: BatchStore) -> None:
    f = _file(store, "alice")
    b = _batch(store, "alice", f.id)
    assert store.get_batch("bob", b.id) is None and store.get_batch("alice", b.id) == b
    assert store.request_cancel("bob", b.id, 5) is None
    assert store.file_in_use(f.id)
    got = store.request_cancel("alice", b.id, 200)
    assert got is not None and got.status == CANCELLING and got.cancelling_at == 200
    assert store.request_cancel("alice", b.id, 300) == got  # again: as it is
    store.set_status(b.id, CANCELLED, 400)
    assert not store.file_in_use(f.id)
    store.set_status(b.id, COMPLETED, 400)
    with pytest.raises(NotCancellable):
        store.request_cancel("alice", b.id, 500)


def test_a_line_is_answered_once_and_progress_survives_a_reopen(tmp_path: pathlib.Path) -> None:
    store = BatchStore(tmp_path, BatchLimits())
    f = _file(store, "alice")
    b = _batch(store, "alice", f.id)
    assert store.record_result(b.id, 0, True, b'{"a":0}')
    assert not store.record_result(b.id, 0, False, b'{"a":"again"}')
    assert store.record_result(b.id, 2, False, b'{"a":2}')
    (store.files_dir / "file-x.part").write_bytes(b"cut short")
    store.close()
    store = BatchStore(tmp_path, BatchLimits())  # (a restarted ingress)
    got = store.get_batch(None, b.id)
    assert got is not None and (got.completed, got.failed) == (1, 1)
    assert got.metadata == {"a": "b"} and got.active
    assert store.done_lines(b.id) == {0, 2}
    assert store.write_results(b.id, True, tmp_path / "out") == (8, 1)
    assert (tmp_path / "out").read_bytes() == b'{"a":0}\n'
    assert [x.id for x in store.active_batches("alice")] == [b.id]
    assert store.active_batches("bob") == []
    assert not (store.files_dir / "file-x.part").exists()
    store.drop_results(b.id)
    assert store.done_lines(b.id) == set()
    store.close()


@pytest.mark.hostile
def test_answers_left_by_a_crash_after_the_end_are_dropped_at_the_next_start(
        tmp_path: pathlib.Path) -> None:
    # The runner ends a batch, then drops its kept answers: a crash between the two left
    # them (up to max_output_bytes) in batch.db for good. A reopen drops the answers of
    # every batch that is no longer active, and keeps an active batch's progress.
    store = BatchStore(tmp_path, BatchLimits())
    f = _file(store, "alice")
    ended, running = _batch(store, "alice", f.id), _batch(store, "alice", f.id)
    for b in (ended, running):
        store.record_result(b.id, 0, True, b'{"a":0}')
    store.set_status(ended.id, COMPLETED, 200)
    store.close()
    store = BatchStore(tmp_path, BatchLimits())
    assert store.done_lines(ended.id) == set() and store.done_lines(running.id) == {0}
    store.close()


def test_the_answers_of_a_large_batch_are_dropped_in_chunks(tmp_path: pathlib.Path) -> None:
    # (one DELETE of a gigabyte of answers held SQLite's write lock throughout)
    store = BatchStore(tmp_path, BatchLimits())
    f = _file(store, "alice")
    b, other = _batch(store, "alice", f.id), _batch(store, "alice", f.id)
    store.record_unsent(b.id, ((n, b"{}") for n in range(2_500) if n != 1_000))
    store.record_result(other.id, 0, True, b"{}")
    statements: list[str] = []
    connect = store._connect

    def traced() -> sqlite3.Connection:
        db = connect()
        db.set_trace_callback(statements.append)
        return db

    store._connect = traced  # type: ignore[method-assign]
    store.drop_results(b.id)
    assert store.done_lines(b.id) == set() and store.done_lines(other.id) == {0}
    assert sum(s.startswith("DELETE") for s in statements) == 3
    store.close()


def test_a_line_s_usage_is_counted_once(store: BatchStore) -> None:
    f = _file(store, "alice")
    b = _batch(store, "alice", f.id)
    assert store.record_result(b.id, 0, True, b"{}", Usage(5, 1, 2, 0))
    assert not store.record_result(b.id, 0, True, b"{}", Usage(5, 1, 2, 0))  # (again)
    assert store.record_result(b.id, 1, True, b"{}", Usage(1 << 32, 0, 1 << 32, 0))
    got = store.get_batch("alice", b.id)
    assert got is not None and got.usage == Usage(5 + (1 << 32), 1, 2 + (1 << 32), 0)


def test_a_database_from_before_usage_gets_its_columns(tmp_path: pathlib.Path) -> None:
    # (batch.db as the first release wrote it: no usage columns)
    db = sqlite3.connect(tmp_path / "batch.db")
    db.executescript("""
        CREATE TABLE batches (
            id TEXT PRIMARY KEY, owner TEXT NOT NULL, key_id TEXT NOT NULL,
            endpoint TEXT NOT NULL, input_file_id TEXT NOT NULL,
            completion_window TEXT NOT NULL, status TEXT NOT NULL,
            created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL,
            total INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0,
            failed INTEGER NOT NULL DEFAULT 0, output_file_id TEXT, error_file_id TEXT,
            errors TEXT, metadata TEXT, in_progress_at INTEGER, finalizing_at INTEGER,
            completed_at INTEGER, failed_at INTEGER, expired_at INTEGER,
            cancelling_at INTEGER, cancelled_at INTEGER);
        INSERT INTO batches (id, owner, key_id, endpoint, input_file_id, completion_window,
            status, created_at, expires_at, total, completed)
            VALUES ('batch_000000000000000000000001', 'alice', 'k1', '/v1/chat/completions',
                    'file-000000000000000000000001', '24h', 'completed', 1, 2, 3, 3);
    """)
    db.close()
    store = BatchStore(tmp_path, BatchLimits())
    old = store.get_batch("alice", "batch_000000000000000000000001")
    assert old is not None and old.usage == Usage() and old.completed == 3
    assert old.to_json()["usage"]["total_tokens"] == 0
    b = _batch(store, "alice", _file(store, "alice").id)
    store.record_result(b.id, 0, True, b"{}", Usage(3, 0, 4, 0))
    store.close()
    store = BatchStore(tmp_path, BatchLimits())  # (opened again: nothing added twice)
    got = store.get_batch("alice", b.id)
    assert got is not None and got.usage == Usage(3, 0, 4, 0)
    store.close()


def test_an_expired_file_stops_counting_against_the_caps_at_once(
        tmp_path: pathlib.Path) -> None:
    # An expired file is a 404: its owner can neither list nor delete it. It counted
    # against the caps until the retention sweep (every 60 s, 200 rows) removed it.
    now = [1000.0]
    store = BatchStore(tmp_path, BatchLimits(max_files_per_owner=2, max_bytes_per_owner=100,
                                             max_output_files_per_owner=1),
                       wall=lambda: now[0])
    for _ in range(2):
        store.add_file(FileRecord(store.new_file_id(), "alice", "in.jsonl", "batch", 40, 1,
                                  1, expires_at=2000))
    store.add_file(FileRecord(store.new_file_id(), "alice", "o", "batch_output", 10, 1, 1,
                              expires_at=2000), capped=False)
    assert "2 files" in (store.cap_refusal("alice", 1) or "")
    assert "output files" in (store.stored_refusal("alice") or "")
    now[0] = 2000.0  # (expired; the sweep has not run)
    assert store.list_files("alice", None, None, 10) == ([], False)
    assert store.owner_usage("alice") == (0, 0)
    assert store.cap_refusal("alice", 100) is None and store.stored_refusal("alice") is None
    store.close()


def test_an_expired_input_an_active_batch_reads_still_counts(tmp_path: pathlib.Path) -> None:
    # The sweep keeps such a file on disk until its batch ends (up to 24 h): uncounted, its
    # owner could upload it again and hold twice the cap meanwhile.
    now = [1000.0]
    store = BatchStore(tmp_path, BatchLimits(max_files_per_owner=2, max_bytes_per_owner=100),
                       wall=lambda: now[0])
    read = FileRecord(store.new_file_id(), "alice", "in.jsonl", "batch", 60, 1, 1,
                      expires_at=2000)
    store.add_file(read)
    store.add_file(FileRecord(store.new_file_id(), "alice", "in.jsonl", "batch", 30, 1, 1,
                              expires_at=2000))
    _batch(store, "alice", read.id)
    now[0] = 2000.0
    assert store.owner_usage("alice") == (1, 60)
    assert "bytes" in (store.cap_refusal("alice", 41) or "")
    assert store.stored_refusal("alice") is None
    store.close()
