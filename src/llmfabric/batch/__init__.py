"""OpenAI's Batch API over an ingress (layered above it: the ingress never imports this
package; a composition root mounts it). docs/batch.md.

Files:
- limits.py: `BatchLimits` (file, line and per-owner caps, concurrency), the endpoints a
  batch may target, OpenAI's metadata limits.
- records.py: `FileRecord`, `BatchRecord` (and their OpenAI JSON), the batch states.
- store.py: `BatchStore`: files on disk, metadata, batches and each batch's answered lines
  in SQLite (WAL); `OverCap`, `NotCancellable`.
- validate.py: `UploadCheck` (caps while an upload streams), `validate_input` (every line
  a request of the batch's endpoint, unique custom_id), `requests_of` (lines to run).
- lines.py: `serve_through` (a line through `Ingress.serve` as a principal, never
  streamed), the output and error file records.
- runner.py: `BatchRunner` (validating -> in_progress -> finalizing -> completed; cancel,
  expiry, resume after a restart, bounded concurrency).
"""
