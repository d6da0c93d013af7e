"""Web UI served at /ui: catalog, nodes, keys, usage, chat playground, traces, registry
inspector.

No build step: plain HTML, CSS and JavaScript modules shipped as package data and served from
memory by the ingress. The browser code reads the JSON API of docs/http-api.md on the same
origin; every piece of data it shows is inserted as text (never as HTML).

Files:
- routes.py: `add_dashboard_routes(app, prefix="/ui")`, the aiohttp routes serving the static
  bundle with a strict Content-Security-Policy, ETags and no directory traversal.
- errors.py: the package's exception hierarchy.
- static/index.html: the page shell (navigation, live region, view container).
- static/css/app.css: layout, light/dark themes, responsive tables.
- static/js/app.js: hash router, sign-in state, page lifecycle (start/stop polling).
- static/js/api.js: fetch wrapper (bearer key, OpenAI error shape -> ApiError).
- static/js/dom.js: `h()` element builder (text only), formatting helpers.
- static/js/sse.js: incremental server-sent-events parser for streamed chat completions.
- static/js/chart.js: small SVG stacked bar chart.
- static/js/keyid.js: the public key id inside a plaintext API key (`keyIdOf`).
- static/js/pages/*.js: one module per page (catalog, nodes, keys, usage, chat, traces,
  registry); pages/common.js: what several pages share.
"""

from llmfabric.dashboard.routes import add_dashboard_routes

__all__ = ["add_dashboard_routes"]
