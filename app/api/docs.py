"""FastAPI's own pages: the OpenAPI document and Swagger UI.

Served from the route table like every other route (``app.api.routes``), so that
``security.authorize`` sees them too; they answer what FastAPI's built-in pages answered
(the app is created with those turned off), except that Swagger UI's script, stylesheet
and icon are served from here, not from a CDN: the page works on a machine without
internet access.  They are the files of Swagger UI's distribution that the
``fastapi-offline`` package ships (MIT; Swagger UI itself is Apache 2.0), read from
where that package is installed.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response

OPENAPI_URL = "/openapi.json"
DOCS_URL = "/docs"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
SWAGGER_JS_URL = "/docs/swagger-ui-bundle.js"
SWAGGER_CSS_URL = "/docs/swagger-ui.css"
FAVICON_URL = "/docs/favicon.png"

_ASSETS = Path(str(resources.files("fastapi_offline") / "static"))
# Browsers may keep them a day: they change only with the package.
_CACHED = {"Cache-Control": "public, max-age=86400"}


async def openapi_document(request: Request) -> Response:
    root_path = request.scope.get("root_path", "").rstrip("/")
    schema = request.app.openapi()
    if root_path and request.app.root_path_in_servers:
        server_urls = {s.get("url") for s in schema.get("servers", [])}
        if root_path not in server_urls:
            schema = {**schema, "servers": [{"url": root_path}, *schema.get("servers", [])]}
    return JSONResponse(schema)


async def swagger_ui(request: Request) -> Response:
    root_path = request.scope.get("root_path", "").rstrip("/")
    return get_swagger_ui_html(
        openapi_url=root_path + OPENAPI_URL,
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=root_path + SWAGGER_JS_URL,
        swagger_css_url=root_path + SWAGGER_CSS_URL,
        swagger_favicon_url=root_path + FAVICON_URL,
        oauth2_redirect_url=root_path + OAUTH2_REDIRECT_URL,
        init_oauth=request.app.swagger_ui_init_oauth,
        # No validator badge: it sends the document to an outside validator.
        swagger_ui_parameters={**(request.app.swagger_ui_parameters or {}), "validatorUrl": None},
    )


async def swagger_ui_redirect(request: Request) -> Response:
    return get_swagger_ui_oauth2_redirect_html()


async def swagger_js(request: Request) -> Response:
    return _asset("swagger-ui-bundle.js", "text/javascript; charset=utf-8")


async def swagger_css(request: Request) -> Response:
    return _asset("swagger-ui.css", "text/css; charset=utf-8")


async def favicon(request: Request) -> Response:
    return _asset("favicon.png", "image/png")


def _asset(name: str, media_type: str) -> Response:
    return FileResponse(_ASSETS / name, media_type=media_type, headers=_CACHED)
