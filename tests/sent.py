"""Seeing the requests a jobq AsyncClient sends, every try of every call, as `METHOD /path`."""

from __future__ import annotations

from typing import Any

import aiohttp


def recording(sent: list[str]) -> dict[str, Any]:
    """Keyword arguments for `AsyncClient(...)` that append each request it sends to `sent`."""

    async def started(session: Any, context: Any, params: aiohttp.TraceRequestStartParams) -> None:
        sent.append(f"{params.method} {params.url.path}")

    config = aiohttp.TraceConfig()
    config.on_request_start.append(started)
    return {"trace_configs": [config]}
