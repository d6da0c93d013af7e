"""The dashboard's static routes: what they serve, with which headers, and what they refuse."""

from __future__ import annotations

import re
from importlib import resources

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from llmfabric.dashboard import add_dashboard_routes
from llmfabric.dashboard.errors import AssetsMissing, InvalidPrefix
from llmfabric.dashboard.routes import CSP, load_assets

STATIC = resources.files("llmfabric.dashboard") / "static"


async def client_for(prefix: str = "/ui") -> TestClient[web.Request, web.Application]:
    app = web.Application()
    add_dashboard_routes(app, prefix=prefix)
    client: TestClient[web.Request, web.Application] = TestClient(TestServer(app))
    await client.start_server()
    return client


async def test_index_is_served_with_a_strict_content_security_policy() -> None:
    client = await client_for()
    try:
        resp = await client.get("/ui/")
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/html")
        assert resp.headers["Content-Security-Policy"] == CSP
        assert "script-src 'self'" in CSP and "unsafe-inline" not in CSP
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        body = await resp.text()
        assert '<script type="module" src="js/app.js">' in body
    finally:
        await client.close()


async def test_bare_prefix_redirects_to_the_index() -> None:
    client = await client_for()
    try:
        resp = await client.get("/ui", allow_redirects=False)
        assert resp.status == 308
        assert resp.headers["Location"] == "/ui/"
    finally:
        await client.close()


async def test_every_module_is_served_as_javascript_and_etags_give_304() -> None:
    client = await client_for("/dash")
    try:
        for path in ("js/app.js", "js/pages/chat.js", "css/app.css"):
            resp = await client.get(f"/dash/{path}")
            assert resp.status == 200, path
            kind = "text/css" if path.endswith(".css") else "text/javascript"
            assert resp.headers["Content-Type"].startswith(kind)
            etag = resp.headers["ETag"]
            again = await client.get(f"/dash/{path}", headers={"If-None-Match": etag})
            assert again.status == 304
    finally:
        await client.close()


@pytest.mark.parametrize(
    "path",
    [
        "/ui/../routes.py",
        "/ui/%2e%2e/routes.py",
        "/ui/js/../../routes.py",
        "/ui/nope.js",
        "/ui/js/",
        "/ui/__init__.py",
    ],
)
async def test_unknown_and_traversal_paths_are_404(path: str) -> None:
    client = await client_for()
    try:
        resp = await client.get(path)
        assert resp.status == 404
        assert "import" not in await resp.text()
    finally:
        await client.close()


def test_bad_prefixes_are_refused() -> None:
    for prefix in ("ui", "/ui/", "/", "/u i"):
        with pytest.raises(InvalidPrefix):
            add_dashboard_routes(web.Application(), prefix=prefix)


def test_missing_assets_say_how_to_fix(tmp_path: object) -> None:
    import pathlib

    root = pathlib.Path(str(tmp_path))
    with pytest.raises(AssetsMissing, match="reinstall"):
        load_assets(root / "absent")
    (root / "x.js").write_text("export {};")
    with pytest.raises(AssetsMissing, match=r"index\.html"):
        load_assets(root)


def _sources() -> dict[str, str]:
    return {name: asset.body.decode() for name, asset in load_assets().items()}


def test_browser_code_never_parses_data_as_html() -> None:
    banned = re.compile(
        r"innerHTML|outerHTML\s*=|insertAdjacentHTML|document\.write|eval\(|"
        r"new Function|setAttribute\(\s*['\"]on|style="
    )
    for name, text in _sources().items():
        if name.endswith(".js"):
            assert not banned.search(text), f"{name} builds HTML from strings"


def test_every_relative_import_resolves_to_a_served_module() -> None:
    sources = _sources()
    imports = re.compile(r"""(?:from|import\()\s*['"](\.[^'"]+)['"]""")
    for name, text in sources.items():
        if not name.endswith(".js"):
            continue
        base = name.rsplit("/", 1)[0]
        for rel in imports.findall(text):
            parts = [*base.split("/"), *rel.split("/")]
            stack: list[str] = []
            for p in parts:
                if p == "..":
                    stack.pop()
                elif p != ".":
                    stack.append(p)
            assert "/".join(stack) in sources, f"{name} imports missing {rel}"


def test_index_references_only_served_files() -> None:
    sources = _sources()
    index = sources["index.html"]
    for ref in re.findall(r'(?:src|href)="([^"#:]+)"', index):
        assert ref in sources, ref
    assert 'lang="en"' in index and 'name="viewport"' in index
