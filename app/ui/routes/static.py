"""The dashboard's stylesheet and script, served as they are (no build step), to anyone."""

from __future__ import annotations

from functools import cache
from pathlib import Path as FilePath

from fastapi import APIRouter, HTTPException, Response

STATIC = FilePath(__file__).resolve().parent.parent / "static"
STATIC_TYPES = {"ui.css": "text/css; charset=utf-8", "ui.js": "text/javascript; charset=utf-8"}


router = APIRouter()


@router.get("/ui/static/{name}", response_model=None)
async def static(name: str) -> Response:
    if name not in STATIC_TYPES:
        raise HTTPException(404, f"no dashboard file {name!r}")
    return Response(_static_file(name), media_type=STATIC_TYPES[name], headers={"Cache-Control": "no-cache"})


@cache
def _static_file(name: str) -> bytes:
    return (STATIC / name).read_bytes()
