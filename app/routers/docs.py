"""The API's documentation: ``/openapi.json``, Swagger UI at ``/docs`` and ReDoc at ``/redoc``.

FastAPI serves these itself, as plain routes with no dependencies, so they stay public whatever tokens
are configured. jobq turns FastAPI's own off (``openapi_url=None`` and friends, app/main.py) and
serves the same pages here, behind a role check that admits every role: with tokens configured, any
valid token reads the documentation (a browser needs the token sent for it, as for the dashboard,
e.g. by a proxy); without tokens they are open, as before. The document itself is still the app's
(``app.openapi()``), so ``jobq openapi`` and the committed openapi.json are made offline as ever. The
pages load Swagger UI and ReDoc from their CDN, as FastAPI's do.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse, JSONResponse

from app.auth import AnyRole

OPENAPI_URL = "/openapi.json"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"

router = APIRouter(include_in_schema=False, dependencies=[AnyRole])


def _root(request: Request) -> str:
    return request.scope.get("root_path", "").rstrip("/")


@router.get(OPENAPI_URL)
async def openapi(request: Request) -> JSONResponse:
    """The OpenAPI document, with the root path the service is mounted under as its server, if any
    (as FastAPI's own route answers it)."""
    schema = request.app.openapi()
    root = _root(request)
    if root and root not in {server.get("url") for server in schema.get("servers", [])}:
        schema = {**schema, "servers": [{"url": root}, *schema.get("servers", [])]}
    return JSONResponse(schema)


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    root = _root(request)
    return get_swagger_ui_html(
        openapi_url=root + OPENAPI_URL,
        title=f"{request.app.title} - Swagger UI",
        oauth2_redirect_url=root + OAUTH2_REDIRECT_URL,
    )


@router.get(OAUTH2_REDIRECT_URL)
async def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(openapi_url=_root(request) + OPENAPI_URL, title=f"{request.app.title} - ReDoc")
