"""The API's documentation: ``/openapi.json`` and Swagger UI at ``/docs``.

FastAPI serves these itself, as plain routes with no dependencies, so they stay public whatever tokens
are configured. jobq turns FastAPI's own off (``openapi_url=None`` and friends, app/main.py) and
serves the same pages here, behind a role check that admits every role: with tokens configured, any
valid token reads the documentation (a browser needs the token sent for it, as for the dashboard,
e.g. by a proxy); without tokens they are open, as before. The document itself is still the app's
(``app.openapi()``), so ``jobq openapi`` and the committed openapi.json are made offline as ever.

Swagger UI comes with the package (app/http/docs_assets/, served under /docs/assets/), not from a CDN as
FastAPI's page loads it: the docs work on a machine with no internet, and a page of the service loads
nothing from elsewhere. ReDoc is not shipped (a second megabyte of script for the same document); /redoc
sends its readers to /docs.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

from app.http.auth import AnyRole

OPENAPI_URL = "/openapi.json"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
SWAGGER_UI_VERSION = "5.35.0"  # of the files in app/http/docs_assets/ (see its README)
ASSETS = Path(__file__).resolve().parent.parent / "docs_assets"
# The version is in the assets' path, so a browser may keep them: a new version is a new path.
ASSETS_URL = f"/docs/assets/{SWAGGER_UI_VERSION}"
ASSET_TYPES = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon-32x32.png": "image/png",
}

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
        swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
        swagger_favicon_url=f"{root}{ASSETS_URL}/favicon-32x32.png",
    )


@router.get(ASSETS_URL + "/{name}")
async def swagger_ui_asset(name: str) -> Response:
    if name not in ASSET_TYPES:
        raise HTTPException(404, f"no documentation file {name!r}")
    headers = {"Cache-Control": "public, max-age=604800, immutable"}
    return Response(_asset(name), media_type=ASSET_TYPES[name], headers=headers)


@cache
def _asset(name: str) -> bytes:
    return (ASSETS / name).read_bytes()


@router.get(OAUTH2_REDIRECT_URL)
async def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc")
async def redoc(request: Request) -> RedirectResponse:
    return RedirectResponse(_root(request) + "/docs", status_code=308)
