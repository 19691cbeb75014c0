"""FastAPI's own pages: the OpenAPI document and Swagger UI.

Served from the route table like every other route (``app.api.routes``), so that
``security.authorize`` sees them too; they answer what FastAPI's built-in pages answered
(the app is created with those turned off).
"""

from __future__ import annotations

from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

OPENAPI_URL = "/openapi.json"
DOCS_URL = "/docs"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"


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
        oauth2_redirect_url=root_path + OAUTH2_REDIRECT_URL,
        init_oauth=request.app.swagger_ui_init_oauth,
        swagger_ui_parameters=request.app.swagger_ui_parameters,
    )


async def swagger_ui_redirect(request: Request) -> Response:
    return get_swagger_ui_oauth2_redirect_html()
