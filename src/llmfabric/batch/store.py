"""`BatchStore`: the Batch API's files (on disk, under `<dir>/files/`, named by their ids)
and their metadata, the batches and each batch's finished lines (SQLite, WAL, in
`<dir>/batch.db`).

A batch's progress is its `results` rows, one per input line, written once (the primary key
(batch, line) makes a second answer of a line a no-op), with the batch's counts in the same
transaction: after a restart the runner runs only the lines without a row. The output and
error files are written from these rows when the batch ends, then the rows are dropped.
The bulk steps of a batch's end (`record_unsent`, `write_results`, `drop_results`: up to
50,000 rows and gigabytes of answers) are for a worker thread: each opens its own
connection and commits in chunks, so the event loop's connection waits milliseconds at most.

Every read that a client's request makes names the owner: another owner's file or batch is
not found, nor is an expired file (its `expires_at`, or older than the operator's
retention: retention.py, whose sweep deletes them with `forget_expired`). Ids are ours
(random hex), so a client's text never becomes a path.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import re
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from itertools import islice
from typing import Any

import orjson

from llmfabric.batch.limits import FILE_PURPOSE, OUTPUT_PURPOSE, BatchLimits
from llmfabric.batch.records import (
    ACTIVE,
    CANCELLING,
    STAMPS,
    BatchRecord,
    FileRecord,
    Usage,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, lines INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS files_by_owner ON files (owner);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, key_id TEXT NOT NULL, endpoint TEXT NOT NULL,
    input_file_id TEXT NOT NULL, completion_window TEXT NOT NULL, status TEXT NOT NULL,
    created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL,
    total INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0, output_file_id TEXT, error_file_id TEXT,
    errors TEXT, metadata TEXT, in_progress_at INTEGER, finalizing_at INTEGER,
    completed_at INTEGER, failed_at INTEGER, expired_at INTEGER, cancelling_at INTEGER,
    cancelled_at INTEGER);
CREATE INDEX IF NOT EXISTS batches_by_owner ON batches (owner);
CREATE TABLE IF NOT EXISTS results (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, ok INTEGER NOT NULL, record BLOB NOT NULL,
    PRIMARY KEY (batch_id, line));
"""
# Columns added after the tables were first shipped (table, column, declaration): added to
# a database that lacks them when it is opened (as accounts/db.py ADDED_COLUMNS).
_ADDED_COLUMNS = (
    # The batch's usage: tokens of its lines answered successfully (records.Usage).
    ("batches", "input_tokens", "INTEGER NOT NULL DEFAULT 0"),
    ("batches", "cached_tokens", "INTEGER NOT NULL DEFAULT 0"),
    ("batches", "output_tokens", "INTEGER NOT NULL DEFAULT 0"),
    ("batches", "reasoning_tokens", "INTEGER NOT NULL DEFAULT 0"),
    # Retention (retention.py): when a file expires (Unix seconds; NULL: only the operator's
    # retention), and the seconds a batch's output and error files are kept.
    ("files", "expires_at", "INTEGER"),
    ("batches", "output_expires_after", "INTEGER"),
)
# (on columns added above: made once they exist) What the retention sweep looks up.
_INDEXES = """
CREATE INDEX IF NOT EXISTS files_by_expiry ON files (expires_at);
CREATE INDEX IF NOT EXISTS files_by_age ON files (created_at);
CREATE INDEX IF NOT EXISTS batches_by_end ON batches (
    COALESCE(completed_at, failed_at, expired_at, cancelled_at));
CREATE INDEX IF NOT EXISTS batches_by_status ON batches (status);
"""
_USAGE_COLS = ("input_tokens", "cached_tokens", "output_tokens", "reasoning_tokens")
# A usage sum stops here: each line adds at most lines.MAX_LINE_TOKENS (10**8), so the sum
# never passes SQLite's 64-bit integers (past them it would become a float).
_MAX_USAGE = 1 << 62
_FILE_COLS = "id, owner, filename, purpose, bytes, created_at, lines, expires_at"
_BATCH_COLS = ("id, owner, key_id, endpoint, input_file_id, completion_window, status, "
               "created_at, expires_at, total, completed, failed, output_file_id, "
               "error_file_id, errors, metadata, in_progress_at, finalizing_at, completed_at, "
               "failed_at, expired_at, cancelling_at, cancelled_at, output_expires_after, "
               + ", ".join(_USAGE_COLS))
_BATCH_NAMES = tuple(c.strip() for c in _BATCH_COLS.split(","))
_CHUNK = 1000  # rows a transaction of the bulk steps (record_unsent, drop_results)
_ENDED_AT = "COALESCE(completed_at, failed_at, expired_at, cancelled_at)"  # (batches_by_end)
_LIVE_FILE = "(expires_at IS NULL OR expires_at > ?) AND created_at > ?"  # (now, cutoff)
_NEVER = float(1 << 62)
FILE_ID = re.compile(r"file-[0-9a-f]{24}")
BATCH_ID = re.compile(r"batch_[0-9a-f]{24}")


class OverCap(Exception):
    """An owner's stored files would pass a cap of `BatchLimits` (the message says which)."""


class NotCancellable(Exception):
    """The batch has ended (or is finalizing): nothing left to cancel."""


def _batch(row: tuple[Any, ...]) -> BatchRecord:
    fields = dict(zip(_BATCH_NAMES, row, strict=True))
    errors, metadata = fields.pop("errors"), fields.pop("metadata")
    usage = Usage(*(int(fields.pop(c)) for c in _USAGE_COLS))
    return BatchRecord(**fields, errors=tuple(orjson.loads(errors)) if errors else (),
                       metadata=orjson.loads(metadata) if metadata else None, usage=usage)


class BatchStore:
    """Files and batches of one batch directory (one ingress process uses it at a time)."""

    def __init__(self, directory: pathlib.Path, limits: BatchLimits, *,
                 retention_s: float | None = None,
                 wall: Callable[[], float] = time.time) -> None:
        """`retention_s`: the operator's retention (retention.py; None: files and batches
        stay until deleted or their own expiry). `wall`: the clock expiry is read on."""
        self.limits = limits
        self.retention_s = retention_s
        self.wall = wall
        self.files_dir = directory / "files"
        self.files_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for stale in self.files_dir.glob("*.part"):  # uploads a crash cut short
            stale.unlink(missing_ok=True)
        self._db_path = directory / "batch.db"
        self._uploading: dict[str, tuple[int, int]] = {}  # owner: (uploads, bytes so far)
        # An uploading owner's stored bytes as last read (`upload_grew`); forgotten when a
        # file is registered (deletes and expiry only lower them: it stays a bound).
        self._stored: dict[str, int] = {}
        self._db = self._connect()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)
        for table, column, decl in _ADDED_COLUMNS:
            cols = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            if column not in cols:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
        self._db.executescript(_INDEXES)
        marks = ",".join("?" * len(ACTIVE))
        with self._db:  # (answers a crash left between a batch's end and their drop)
            self._db.execute("DELETE FROM results WHERE batch_id NOT IN (SELECT id FROM "
                             f"batches WHERE status IN ({marks}))", ACTIVE)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self._db_path, timeout=30.0)
        db.execute("PRAGMA synchronous=NORMAL")
        return db

    def close(self) -> None:
        self._db.close()

    # -- files -----------------------------------------------------------------------------

    def new_file_id(self) -> str:
        return f"file-{secrets.token_hex(12)}"

    def path_of(self, file_id: str) -> pathlib.Path:
        """Where a file's bytes are (`file_id` is one of ours: FILE_ID)."""
        if not FILE_ID.fullmatch(file_id):
            raise ValueError(f"not a file id: {file_id!r}")
        return self.files_dir / file_id

    def owner_usage(self, owner: str) -> tuple[int, int]:
        """(files, bytes) the owner uploaded (batch outputs not counted) and can still see:
        an expired file, which the owner can no longer list or delete, stops counting at
        once, not when the retention sweep gets to it; unless an active batch reads it (the
        sweep keeps it on disk until that batch ends: `_held`)."""
        n, size = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM files WHERE owner = ? AND "
            f"purpose = ? AND {self._held}", (owner, FILE_PURPOSE, *self._live(), *ACTIVE)
        ).fetchone()
        return int(n), int(size)

    def cap_refusal(self, owner: str, adding: int, new_files: int = 1) -> str | None:
        """Why `owner` may not store `new_files` more uploads of `adding` more bytes, or
        None (the uploads still streaming count as stored: `start_upload`)."""
        n, size = self.owner_usage(owner)
        streaming, streamed = self._uploading.get(owner, (0, 0))
        n, size = n + streaming, size + streamed
        lim = self.limits
        if new_files and n + new_files > lim.max_files_per_owner:
            return (f"you have {n} files stored or uploading, the most this ingress keeps "
                    f"per owner ({lim.max_files_per_owner}); delete some (DELETE "
                    "/v1/files/ID)")
        if size + adding > lim.max_bytes_per_owner:
            return (f"your files would take {size + adding} bytes, over this ingress's "
                    f"{lim.max_bytes_per_owner} bytes per owner; delete some first")
        return None

    def stored_refusal(self, owner: str) -> str | None:
        """Why `owner` may not start a batch: its files, batch outputs included, take its
        byte cap, or it keeps max_output_files_per_owner outputs (outputs are never
        refused, so a new batch is), or None."""
        outputs, size = self._db.execute(  # (expired files not counted: owner_usage)
            "SELECT COALESCE(SUM(purpose = ?), 0), COALESCE(SUM(bytes), 0) FROM files "
            f"WHERE owner = ? AND {self._held}", (OUTPUT_PURPOSE, owner, *self._live(), *ACTIVE)
        ).fetchone()
        if outputs >= self.limits.max_output_files_per_owner:
            return (f"you keep {outputs} batch output files, the most this ingress keeps per "
                    "owner before a new batch; delete old ones (DELETE /v1/files/ID)")
        if size >= self.limits.max_bytes_per_owner:
            return (f"your files, batch outputs included, take {size} bytes, this "
                    f"ingress's {self.limits.max_bytes_per_owner} bytes per owner; delete "
                    "some (old batch outputs) first")
        return None

    def start_upload(self, owner: str) -> str | None:
        """Count an upload that starts streaming against the owner's caps at once (None),
        or why it may not start: uploads raced in parallel cannot pass the caps on disk
        before any of them is registered. Each start has one `end_upload`."""
        if (why := self.cap_refusal(owner, 0)) is not None:
            return why
        n, size = self._uploading.get(owner, (0, 0))
        self._uploading[owner] = (n + 1, size)
        return None

    def upload_grew(self, owner: str, added: int) -> str | None:
        """`added` more bytes of one of the owner's uploads arrived; why they pass the
        owner's byte cap (with the stored files and the other uploads), or None."""
        n, size = self._uploading[owner]
        self._uploading[owner] = (n, size + added)
        # (a query per 8 KiB chunk scanned all the owner's files: with 1,000 batch outputs,
        # 1.2 s of the event loop for one 90 MiB upload; the bound spares it)
        stored = self._stored.get(owner)
        if stored is not None and stored + size + added <= self.limits.max_bytes_per_owner:
            return None
        self._stored[owner] = self.owner_usage(owner)[1]
        return self.cap_refusal(owner, 0, new_files=0)

    def end_upload(self, owner: str, streamed: int) -> None:
        """An upload of `streamed` bytes ended (registered with add_file after, or not)."""
        n, size = self._uploading.pop(owner)
        if n > 1:
            self._uploading[owner] = (n - 1, size - streamed)
        else:
            self._stored.pop(owner, None)

    def add_file(self, record: FileRecord, *, capped: bool = True) -> None:
        """Register a file whose bytes are at `path_of(record.id)` (checked against the
        owner's caps again here, where no other request can interleave: OverCap)."""
        if capped and (why := self.cap_refusal(record.owner, record.bytes)) is not None:
            raise OverCap(why)
        self._stored.pop(record.owner, None)  # (its stored bytes grow: `upload_grew`)
        with self._db:
            self._db.execute(f"INSERT INTO files ({_FILE_COLS}) VALUES "
                             "(?, ?, ?, ?, ?, ?, ?, ?)",
                             (record.id, record.owner, record.filename, record.purpose,
                              record.bytes, record.created_at, record.lines,
                              record.expires_at))

    def _file(self, row: tuple[Any, ...]) -> FileRecord:
        return self.shown(FileRecord(*row))

    def shown(self, f: FileRecord) -> FileRecord:
        """The file as clients see it: its `expires_at` the earlier of its own and the
        retention's."""
        if self.retention_s is None:
            return f
        ends = f.created_at + int(self.retention_s)
        return replace(f, expires_at=ends if f.expires_at is None else min(f.expires_at, ends))

    # The files a caller's caps count (args: `_live()`, then ACTIVE): those not expired, and
    # those an active batch reads (kept on disk until it ends, `forget_expired`: else an
    # owner re-uploading its expired input held twice its cap for a batch's 24 h).
    _held = (f"({_LIVE_FILE} OR id IN (SELECT input_file_id FROM batches WHERE status IN "
             f"({','.join('?' * len(ACTIVE))})))")

    def _live(self) -> tuple[float, float]:
        """The arguments of _LIVE_FILE now: a file expired is no longer found."""
        now = self.wall()
        return now, now - self.retention_s if self.retention_s is not None else -_NEVER

    def get_file(self, owner: str, file_id: str) -> FileRecord | None:
        """The owner's file (None: unknown, another owner's, or expired)."""
        row = self._db.execute(f"SELECT {_FILE_COLS} FROM files WHERE id = ? AND owner = ? "
                               f"AND {_LIVE_FILE}", (file_id, owner, *self._live())).fetchone()
        return self._file(row) if row else None

    def list_files(self, owner: str, purpose: str | None, after: str | None, limit: int,
                   newest_first: bool = True) -> tuple[list[FileRecord], bool]:
        """A page of the owner's files (not expired) and whether more follow."""
        where, args = _LIVE_FILE, list[Any](self._live())
        if purpose:
            where, args = f"{where} AND purpose = ?", [*args, purpose]
        rows = self._page("files", _FILE_COLS, owner, after, limit, newest_first,
                          (where, args))
        return [self._file(r) for r in rows[:limit]], len(rows) > limit

    def file_in_use(self, file_id: str) -> bool:
        """Whether an active batch reads this file."""
        marks = ",".join("?" * len(ACTIVE))
        return self._db.execute(
            f"SELECT 1 FROM batches WHERE input_file_id = ? AND status IN ({marks})",
            (file_id, *ACTIVE)).fetchone() is not None

    def delete_file(self, owner: str, file_id: str) -> bool:
        with self._db:
            gone = self._db.execute("DELETE FROM files WHERE id = ? AND owner = ?",
                                    (file_id, owner)).rowcount > 0
        if gone:
            self.path_of(file_id).unlink(missing_ok=True)
        return gone

    # -- batches ---------------------------------------------------------------------------

    def new_batch_id(self) -> str:
        return f"batch_{secrets.token_hex(12)}"

    def active_batches(self, owner: str | None = None) -> list[BatchRecord]:
        """Batches the runner still owes work, oldest first (one owner's, or everyone's)."""
        marks = ",".join("?" * len(ACTIVE))
        where, args = f"status IN ({marks})", list(ACTIVE)
        if owner is not None:
            where, args = f"{where} AND owner = ?", [*args, owner]
        rows = self._db.execute(f"SELECT {_BATCH_COLS} FROM batches WHERE {where} "
                                "ORDER BY rowid", args).fetchall()
        return [_batch(r) for r in rows]

    def add_batch(self, b: BatchRecord) -> None:
        with self._db:
            self._db.execute(
                "INSERT INTO batches (id, owner, key_id, endpoint, input_file_id, "
                "completion_window, status, created_at, expires_at, metadata, "
                "output_expires_after) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (b.id, b.owner, b.key_id, b.endpoint, b.input_file_id, b.completion_window,
                 b.status, b.created_at, b.expires_at,
                 orjson.dumps(b.metadata).decode() if b.metadata is not None else None,
                 b.output_expires_after))

    def get_batch(self, owner: str | None, batch_id: str) -> BatchRecord | None:
        """The batch (None: unknown, or another owner's; `owner` None: any owner's)."""
        if owner is None:
            row = self._db.execute(f"SELECT {_BATCH_COLS} FROM batches WHERE id = ?",
                                   (batch_id,)).fetchone()
        else:
            row = self._db.execute(f"SELECT {_BATCH_COLS} FROM batches WHERE id = ? AND "
                                   "owner = ?", (batch_id, owner)).fetchone()
        return _batch(row) if row else None

    def list_batches(self, owner: str, after: str | None, limit: int
                     ) -> tuple[list[BatchRecord], bool]:
        rows = self._page("batches", _BATCH_COLS, owner, after, limit, True, ("1", []))
        return [_batch(r) for r in rows[:limit]], len(rows) > limit

    def set_status(self, batch_id: str, status: str, at: int, **fields: Any) -> None:
        """Move a batch to `status` (stamping its time) and set `fields` (`errors`: a list
        of line errors; the others as stored)."""
        if "errors" in fields:
            fields["errors"] = orjson.dumps(fields["errors"]).decode()
        if status in STAMPS:
            fields[STAMPS[status]] = at
        names = ", ".join(f"{k} = ?" for k in fields)
        with self._db:
            self._db.execute(f"UPDATE batches SET status = ?{', ' if names else ''}{names} "
                             "WHERE id = ?", (status, *fields.values(), batch_id))

    def request_cancel(self, owner: str, batch_id: str, at: int) -> BatchRecord | None:
        """Mark the batch cancelling (None: not found; NotCancellable: it has ended)."""
        b = self.get_batch(owner, batch_id)
        if b is None:
            return None
        if b.status in ("validating", "in_progress"):
            self.set_status(batch_id, CANCELLING, at)
            return self.get_batch(owner, batch_id)
        if b.status in (CANCELLING, "cancelled"):
            return b
        raise NotCancellable(f"the batch is {b.status}: there is nothing left to cancel")

    # -- a batch's lines -------------------------------------------------------------------

    def record_result(self, batch_id: str, line: int, ok: bool, record: bytes,
                      usage: Usage | None = None) -> bool:
        """Keep one line's answer (and count it, and its `usage` in the batch's); False when
        the line had one already (its usage is then not counted again)."""
        u = usage or Usage()
        sums = ", ".join(f"{c} = MIN({c} + ?, {_MAX_USAGE})" for c in _USAGE_COLS)
        with self._db:
            added = self._db.execute(
                "INSERT OR IGNORE INTO results (batch_id, line, ok, record) VALUES (?, ?, ?, ?)",
                (batch_id, line, int(ok), record)).rowcount > 0
            if added:
                self._db.execute(f"UPDATE batches SET completed = completed + ?, "
                                 f"failed = failed + ?, {sums} WHERE id = ?",
                                 (int(ok), int(not ok), u.input_tokens, u.cached_tokens,
                                  u.output_tokens, u.reasoning_tokens, batch_id))
        return added

    def record_unsent(self, batch_id: str, records: Iterable[tuple[int, bytes]]) -> None:
        """Keep the records (line, record) of lines never sent, as failed (a worker
        thread's call: its own connection, _CHUNK lines a transaction)."""
        it = iter(records)
        with contextlib.closing(self._connect()) as db:
            while chunk := list(islice(it, _CHUNK)):
                with db:
                    added = db.executemany(
                        "INSERT OR IGNORE INTO results (batch_id, line, ok, record) "
                        "VALUES (?, ?, 0, ?)", [(batch_id, n, r) for n, r in chunk]).rowcount
                    db.execute("UPDATE batches SET failed = failed + ? WHERE id = ?",
                               (added, batch_id))

    def write_results(self, batch_id: str, ok: bool, path: pathlib.Path) -> tuple[int, int]:
        """Write the batch's answered lines of one kind to `path`, in input order, and flush
        it to disk: (bytes, lines) (a worker thread's call: its own connection)."""
        size = lines = 0
        with contextlib.closing(self._connect()) as db, path.open("wb") as f:
            cur = db.execute("SELECT record FROM results WHERE batch_id = ? AND ok = ? "
                             "ORDER BY line", (batch_id, int(ok)))
            while rows := cur.fetchmany(500):
                for (record,) in rows:
                    f.write(record)
                    f.write(b"\n")
                    size += len(record) + 1
                    lines += 1
            f.flush()
            os.fsync(f.fileno())
        return size, lines

    def kept_bytes(self, batch_id: str) -> int:
        """The bytes of the answers a batch keeps so far (after a restart: its output so
        far)."""
        return int(self._db.execute("SELECT COALESCE(SUM(LENGTH(record)), 0) FROM results "
                                    "WHERE batch_id = ?", (batch_id,)).fetchone()[0])

    def done_lines(self, batch_id: str) -> set[int]:
        return {int(r[0]) for r in self._db.execute(
            "SELECT line FROM results WHERE batch_id = ?", (batch_id,))}

    def drop_results(self, batch_id: str) -> None:
        """Drop a finished batch's kept answers (a worker thread's call: its own connection,
        _CHUNK lines a transaction, so the write lock is never held long: a gigabyte of
        answers in one DELETE kept the loop's connection waiting)."""
        with contextlib.closing(self._connect()) as db:
            last = db.execute("SELECT MAX(line) FROM results WHERE batch_id = ?",
                              (batch_id,)).fetchone()[0]
            for start in range(0, -1 if last is None else int(last) + 1, _CHUNK):
                with db:
                    db.execute("DELETE FROM results WHERE batch_id = ? AND line >= ? "
                               "AND line < ?", (batch_id, start, start + _CHUNK))

    # -- retention (retention.py) ----------------------------------------------------------

    def forget_expired(self, now: float, rows: int) -> tuple[list[pathlib.Path], int, int]:
        """Delete (one transaction) up to `rows` batches that ended the retention ago, with
        their output and error files, and up to `rows` files expired (their own expiry, or
        the retention) that no active batch reads: (the paths whose bytes to remove, files,
        batches). Each look-up is on an index: a sweep's cost is its `rows`."""
        marks = ",".join("?" * len(ACTIVE))
        ended: list[tuple[str, str | None, str | None]] = []
        if self.retention_s is not None:
            ended = self._db.execute(
                f"SELECT id, output_file_id, error_file_id FROM batches WHERE {_ENDED_AT} <= ? "
                f"AND status NOT IN ({marks}) LIMIT ?",
                (now - self.retention_s, *ACTIVE, rows)).fetchall()
        reading = f"id NOT IN (SELECT input_file_id FROM batches WHERE status IN ({marks}))"
        expired = {r[0] for r in self._db.execute(
            f"SELECT id FROM files WHERE expires_at <= ? AND {reading} LIMIT ?",
            (now, *ACTIVE, rows))}
        if self.retention_s is not None and len(expired) < rows:
            expired |= {r[0] for r in self._db.execute(
                f"SELECT id FROM files WHERE created_at <= ? AND {reading} LIMIT ?",
                (now - self.retention_s, *ACTIVE, rows - len(expired)))}
        outputs = {f for _, out, err in ended for f in (out, err) if f is not None}
        # (a finalization redone after a restart rewrites its outputs under the same ids:
        # an old one that expired meanwhile is left to the next sweep, not unlinked under it)
        expired -= {output_file_id(b.id, kind) for b in self.active_batches()
                    for kind in ("output", "error")}
        with self._db:
            self._db.executemany("DELETE FROM batches WHERE id = ?",
                                 [(b,) for b, _, _ in ended])
            files = self._db.executemany("DELETE FROM files WHERE id = ?",
                                         [(f,) for f in expired | outputs]).rowcount
        gone = [self.path_of(f) for f in expired | outputs if FILE_ID.fullmatch(f)]
        return gone, max(files, 0), len(ended)

    # -- helpers ---------------------------------------------------------------------------

    def _page(self, table: str, cols: str, owner: str, after: str | None, limit: int,
              newest_first: bool, extra: tuple[str, list[Any]]) -> list[tuple[Any, ...]]:
        where, args = f"owner = ? AND {extra[0]}", [owner, *extra[1]]
        if after:
            cursor = self._db.execute(f"SELECT rowid FROM {table} WHERE id = ? AND owner = ?",
                                      (after, owner)).fetchone()
            if cursor is None:
                return []
            where = f"{where} AND rowid {'<' if newest_first else '>'} ?"
            args.append(cursor[0])
        order = "DESC" if newest_first else "ASC"
        return self._db.execute(f"SELECT {cols} FROM {table} WHERE {where} "
                                f"ORDER BY rowid {order} LIMIT ?", (*args, limit + 1)).fetchall()


def output_file_id(batch_id: str, kind: str) -> str:
    """The id of a batch's "output" or "error" file: derived from the batch's, so a
    finalization cut short by a restart is redone under the same ids, not doubled."""
    return "file-" + hashlib.sha256(f"{batch_id}/{kind}".encode()).hexdigest()[:24]


def fsync_file(path: pathlib.Path) -> None:
    """Flush a written file to disk (before the database points at it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
