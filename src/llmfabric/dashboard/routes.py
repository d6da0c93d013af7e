"""aiohttp routes serving the dashboard's static bundle (no build step) at a prefix, `/ui`.

The bundle is read from package data once, when the routes are added, and served from memory:
lookups go through a dict of known files, so no request path can reach the file system.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

from aiohttp import web

from llmfabric.dashboard.errors import AssetsMissing, InvalidPrefix

CONTENT_TYPES: dict[str, str] = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}

# The page loads only its own scripts and styles and talks only to its own origin; data is
# inserted as text, and this policy is the second line of defence against injected markup.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}

_PREFIX_RE = re.compile(r"^/[A-Za-z0-9_\-]+(/[A-Za-z0-9_\-]+)*\Z")


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


def load_assets(root: Traversable | None = None) -> dict[str, Asset]:
    """Read every html/js/css file under dashboard/static into memory, keyed by relative path."""
    base = root if root is not None else resources.files("llmfabric.dashboard") / "static"
    if not base.is_dir():
        raise AssetsMissing(str(base))
    assets: dict[str, Asset] = {}
    _walk(base, "", assets)
    if "index.html" not in assets:
        raise AssetsMissing(f"{base}/index.html")
    return assets


def _walk(node: Traversable, rel: str, out: dict[str, Asset]) -> None:
    for child in node.iterdir():
        name = f"{rel}{child.name}"
        if child.is_dir():
            _walk(child, f"{name}/", out)
            continue
        suffix = child.name[child.name.rfind(".") :] if "." in child.name else ""
        content_type = CONTENT_TYPES.get(suffix)
        if content_type is None:
            continue
        body = child.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
        out[name] = Asset(body=body, content_type=content_type, etag=etag)


def add_dashboard_routes(
    app: web.Application, prefix: str = "/ui", assets: dict[str, Asset] | None = None
) -> None:
    """Serve the dashboard at `prefix/` (and redirect `prefix` to it).

    The browser code calls the JSON API (docs/http-api.md) on the same origin, at the path
    that precedes `prefix`, so the app it is added to should also serve /v1/... routes.
    """
    if not _PREFIX_RE.match(prefix):
        raise InvalidPrefix(f"dashboard prefix {prefix!r} must look like '/ui' (no trailing /)")
    files = assets if assets is not None else load_assets()

    def respond(request: web.Request, asset: Asset) -> web.Response:
        headers = {**SECURITY_HEADERS, "ETag": asset.etag}
        if request.headers.get("If-None-Match") == asset.etag:
            return web.Response(status=304, headers=headers)
        headers["Content-Type"] = asset.content_type
        return web.Response(body=asset.body, headers=headers)

    async def redirect(request: web.Request) -> web.StreamResponse:
        raise web.HTTPPermanentRedirect(location=f"{prefix}/")

    async def index(request: web.Request) -> web.Response:
        return respond(request, files["index.html"])

    async def static(request: web.Request) -> web.Response:
        asset = files.get(request.match_info["path"])
        if asset is None:
            raise web.HTTPNotFound(
                text="no such dashboard file; open the dashboard at its root page",
                headers={"Cache-Control": "no-cache"},
            )
        return respond(request, asset)

    app.router.add_get(prefix, redirect)
    app.router.add_get(f"{prefix}/", index)
    app.router.add_get(f"{prefix}/{{path:.+}}", static)
