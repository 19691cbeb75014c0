"""/docs works on a machine without internet access: Swagger UI's page names no other
host, and every file it loads is served by Jobfair itself."""

from __future__ import annotations

import re

from app.api.routes import OPERATIONS
from tests.fixtures import Live

ASSET = re.compile(r'(?:src|href)="([^"]+)"')
TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
}


async def test_the_docs_page_names_no_other_host_and_its_files_are_served(live: Live):
    page = await live.client.get("/docs")
    assert page.status_code == 200
    html = page.text
    assert not re.search(r"(?i)\b(?:https?:)?//[a-z0-9]", html), html  # no CDN, no favicon host
    assets = ASSET.findall(html)
    assert {a.rsplit(".", 1)[1] for a in assets} == {"js", "css", "png"}
    for path in assets:
        assert path.startswith("/docs/"), path
        r = await live.client.get(path)
        assert r.status_code == 200, path
        assert r.headers["content-type"] == TYPES["." + path.rsplit(".", 1)[1]], path
        assert len(r.content) > 1000 and r.headers["x-request-id"]
        head = await live.client.head(path)
        assert head.status_code == 200 and head.content == b""
    # The script is Swagger UI's bundle, and the page starts it on our document.
    bundle = (await live.client.get("/docs/swagger-ui-bundle.js")).text
    assert "SwaggerUIBundle" in bundle
    assert "url: '/openapi.json'" in html
    assert '"validatorUrl": null' in html  # the badge would send the document outside


def test_the_docs_files_are_operations_of_the_route_table():
    declared = {op.path for op in OPERATIONS if op.method == "GET"}
    assert {
        "/docs",
        "/docs/swagger-ui-bundle.js",
        "/docs/swagger-ui.css",
        "/docs/favicon.png",
    } <= declared
