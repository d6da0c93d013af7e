"""OpenAI's Batch API over an ingress (layered above it: the ingress never imports this
package; a composition root mounts it): the Files API for batch inputs and outputs, the
Batches API, and a runner that sends each line through the ingress's request core
(`Ingress.serve`) as the key that created the batch. docs/batch.md.

Files:
- service.py: `BatchService` (store + runner + retention sweep + routes, for a composition
  root: `add_routes`, `app`, `start`, `aclose`).
- limits.py: `BatchLimits` (file, line and per-owner caps, concurrency), `batch_limits` /
  `limits_of` (the caps an operator sets, `--batch-limit KEY=VALUE`), the endpoints a
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
- retention.py: `RetentionSweep` (expired files and old batches deleted, a bounded number
  a sweep), `expires_after_s` (OpenAI's expiration policy), `parse_retention`.
- http_common.py: `Caller` / `callers_of` (who calls: the key's owner), OpenAI-shaped
  replies and list pages, the batch app's Host check.
- files_api.py: `FilesApi` (POST/GET/DELETE /v1/files, /v1/files/{id}/content).
- batches_api.py: `BatchesApi` (POST/GET /v1/batches, /v1/batches/{id}/cancel).
- openapi.py: `batch_paths` (the routes above in OpenAPI), `openapi_document` (the
  ingress's document with them).
"""

from llmfabric.batch.limits import BatchLimits
from llmfabric.batch.service import BatchService

__all__ = ["BatchLimits", "BatchService"]
