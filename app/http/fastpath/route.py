"""FastAPI's routing, made jobq's: the route class of every router (``JobqRoute``), which checks a route's
roles before its body is read and refuses unknown query parameters, and the request whose JSON is read
strictly (``StrictJSONRequest``; app/http/web.py says how). It reaches into FastAPI's own description of a
route (its ``dependant``, its ``body_field``), so it lives in the fast path, the one package that does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from app.core.jsontext import read_json
from app.http.auth import GRANT
from app.http.web import nesting_depth


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            limit = self.app.state.settings.max_json_depth
            if nesting_depth(body, limit) > limit:
                raise json.JSONDecodeError(
                    f"nesting deeper than {limit} levels (the service's JOBQ_MAX_JSON_DEPTH)", "", 0
                )
            try:
                self._json = read_json(body)
            except UnicodeDecodeError as exc:
                raise json.JSONDecodeError("it is not UTF-8 text", "", exc.start) from exc
        return self._json


class JobqRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        known = {param.alias for param in self.dependant.query_params}
        # FastAPI reads and parses a route's body before it runs the route's dependencies, role checks
        # included: a stranger's 16 MB body would be parsed before it is refused. So a route that takes a body
        # runs its role checks (app/http/auth.py ``allow``) first, before its body is read (the dependency
        # checks again later: a digest and a dict lookup).
        checks = [
            d.dependency.admits  # type: ignore[attr-defined]
            for d in self.dependencies
            if self.body_field is not None and hasattr(d.dependency, "admits")
        ]

        async def strict_json_handler(request: Request) -> Response:
            for admits in checks:
                request.scope[GRANT] = admits.check(
                    request.app.state.tokens, request.headers.get("authorization", "")
                )
            if request.scope["query_string"]:
                unknown = set(request.query_params) - known
                if unknown:
                    raise RequestValidationError(
                        [
                            {
                                "loc": ("query", name),
                                "msg": "unknown query parameter",
                                "type": "extra_forbidden",
                            }
                            for name in sorted(unknown)
                        ]
                    )
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict_json_handler
