"""`BatchService`: the Batch API of one ingress, composed (store, runner, retention sweep,
Files and Batches routes, their counters on the ingress's /metrics) for a composition root
to mount (`add_routes` on an app it has, or `app` for a standalone ingress's lean front to
hand its other paths to), `start` and `aclose`.

One process per batch directory: the runner of each process would run the same batches.
"""

from __future__ import annotations

import pathlib

import orjson
from aiohttp import web

from llmfabric.batch.batches_api import BatchesApi
from llmfabric.batch.files_api import FilesApi
from llmfabric.batch.http_common import callers_of, host_middleware
from llmfabric.batch.limits import BatchLimits
from llmfabric.batch.lines import LineServer, PrincipalLookup, serve_through
from llmfabric.batch.openapi import openapi_document
from llmfabric.batch.retention import RetentionSweep
from llmfabric.batch.runner import BatchRunner
from llmfabric.batch.store import BatchStore
from llmfabric.clock import Clock, SystemClock
from llmfabric.front.host_check import HostGuard
from llmfabric.front.web_app import add_ingress_routes
from llmfabric.ingress.app import Ingress
from llmfabric.ingress.metrics import metrics_handler


class BatchService:
    def __init__(self, ingress: Ingress, directory: pathlib.Path, *,
                 limits: BatchLimits | None = None, principals: PrincipalLookup | None = None,
                 clock: Clock | None = None, serve_line: LineServer | None = None,
                 retention_s: float | None = None) -> None:
        """`principals`: the key look-up (accounts: `AccountStore.active_key`), required
        when the ingress has API keys. `limits`: by default, lines as large as the
        ingress's body cap. `serve_line`: the ingress's core (tests may wrap it).
        `retention_s`: the operator's retention (retention.py; None: kept until deleted
        or their own expiry)."""
        if ingress.auth is not None and principals is None:
            raise ValueError("an ingress with API keys runs batches as their creators' keys: "
                             "give the key look-up (principals=AccountStore.active_key)")
        self.ingress = ingress
        # The ingress's /openapi.json with the routes below: what its fronts serve
        # (FastFront(openapi_body=...), add_ingress_routes).
        self.openapi_body = orjson.dumps(openapi_document())
        clock = clock or SystemClock()
        self.store = BatchStore(directory, limits or BatchLimits(
            max_line_bytes=ingress.config.max_body_bytes), retention_s=retention_s,
            wall=clock.wall)
        self.runner = BatchRunner(self.store, serve_line or serve_through(ingress), clock,
                                  principals=principals if ingress.auth is not None else None)
        self.retention = RetentionSweep(self.store, clock)
        self._export_counts()
        identify = callers_of(ingress)
        self.files = FilesApi(self.store, identify, clock)
        self.batches = BatchesApi(self.store, identify, clock, self.runner.wake)

    def _export_counts(self) -> None:
        runner, sweep, m = self.runner, self.retention, self.ingress.metrics
        m.add_read_counter(
            "llmfabric_ingress_batch_line_errors", "Batch lines the runner failed itself "
            "(internal_error: the key store raised, or a bug; each logged at the 1st, 2nd, "
            "4th... time)", lambda: runner.line_errors)
        m.add_read_counter("llmfabric_ingress_batch_expired_files",
                           "Batch API files the retention sweep deleted (expired)",
                           lambda: sweep.files)
        m.add_read_counter("llmfabric_ingress_batch_expired_batches",
                           "Batches the retention sweep deleted (ended past the retention)",
                           lambda: sweep.batches)
        m.add_read_counter("llmfabric_ingress_batch_sweep_errors",
                           "Batch retention sweeps that failed (each logged at the 1st, "
                           "2nd, 4th... time)", lambda: sweep.errors)

    def add_routes(self, app: web.Application) -> None:
        self.files.add_routes(app)
        self.batches.add_routes(app)

    def app(self, hosts: HostGuard) -> web.Application:
        """The app of a standalone ingress's other paths: the batch routes, plus the OpenAI
        routes and /metrics for later requests on a connection handed to it."""
        app = web.Application(middlewares=[host_middleware(hosts,
                                                           self.ingress.auth is not None)])
        self.add_routes(app)
        add_ingress_routes(app, self.ingress, self.openapi_body)
        app.router.add_get("/metrics", metrics_handler(self.ingress.metrics))
        return app

    def start(self) -> None:
        self.runner.start()
        self.retention.start()

    async def aclose(self) -> None:
        await self.retention.aclose()
        await self.runner.aclose()
        self.store.close()
