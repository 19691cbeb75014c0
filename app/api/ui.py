"""The dashboard (``GET /ui``): a page and its assets, all served by the app itself.

The assets are plain files shipped in the package (``app/ui/static``, ADR 022): no CDN
and no build step.  They are read once, at import, and answered from memory.  The page
holds no data: it asks the public API for everything with the key its user signs in
with, so the page and its assets need no key themselves.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import Response

from app.errors import NotFound

MEDIA = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}

# Everything the page needs comes from this origin; nothing may frame it.  Data from the
# API is written with textContent, never as HTML, so a tenant named "<script>" is text.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _load() -> dict[str, tuple[bytes, str]]:
    found: dict[str, tuple[bytes, str]] = {}
    for entry in resources.files("app.ui").joinpath("static").iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in MEDIA:
            found[entry.name] = (entry.read_bytes(), MEDIA[suffix])
    return found


ASSETS = _load()


def _answer(name: str) -> Response:
    content, media = ASSETS[name]
    return Response(content, media_type=media, headers=HEADERS)


async def page(request: Request) -> Response:
    return _answer("index.html")


async def asset(request: Request, asset: str) -> Response:
    if asset not in ASSETS or asset == "index.html":
        raise NotFound(f"the dashboard has no asset {asset!r}")
    return _answer(asset)
