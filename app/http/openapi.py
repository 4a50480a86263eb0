"""The OpenAPI document as code generators need it (openapi-python-client, openapi-typescript, ...).

FastAPI writes most of it from the routes and models. What it cannot know is added here, once, when the
document is first asked for:

- operation ids are the routes' names (`enqueue`, `get_job`, `list_queues`), not FastAPI's
  path-and-method defaults (`enqueue_jobs_post`), so generated functions read as the API does;
- an error answer is described under `application/problem+json` alone, the type the service sends:
  FastAPI puts a response's model under `application/json`, and generators then type error bodies as
  nothing at all;
- a route that takes no input lists no `422`;
- each operation says which roles may call it (`x-jobq-roles`, and a line of its description), read
  from its role check (app/http/auth.py), so the document cannot drift from what the service enforces;
- `servers` names where `jobq serve` listens by default;
- examples keep their nulls: FastAPI drops every null from the document (a default of null goes too),
  which left the job examples without fields a job always has, so each model's examples are put back
  as the model gives them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel

from app.core.access import Role
from app.http.problems import PROBLEM_JSON

JSON = "application/json"
SERVERS = [{"url": "http://127.0.0.1:8000", "description": "`jobq serve` on this machine (its default)"}]
# FastAPI's own models for its validation answers, unused once every route answers with Problem.
FASTAPI_VALIDATION = ("HTTPValidationError", "ValidationError")


def operation_id(route: APIRoute) -> str:
    """A route's operationId: its name (the endpoint function's, or the `name` its decorator gives)."""
    return route.name


def install(app: FastAPI, routers: Iterable[APIRouter]) -> None:
    """Make `app.openapi()` return the finished document, for the routes of `routers` (each document
    FastAPI builds is finished once; it builds one, and again only when routes are added)."""
    build = app.openapi
    roles = {
        (method.lower(), route.path_format): _roles(route, router)
        for router in routers
        for route in router.routes
        if isinstance(route, APIRoute) and route.include_in_schema
        for method in route.methods
    }
    finished: dict[str, Any] | None = None

    def openapi() -> dict[str, Any]:
        nonlocal finished
        document = build()
        if document is not finished:
            finish(document, roles)
            finished = document
        return document

    app.openapi = openapi  # type: ignore[method-assign]


def finish(document: dict[str, Any], roles: dict[tuple[str, str], list[str] | None]) -> None:
    """Add to FastAPI's `document`, in place, what it cannot know (the module's docstring); `roles`:
    which roles may call each (method, path), None for none needed."""
    for path, item in document.get("paths", {}).items():
        for method, operation in item.items():
            _problems_as_sent(operation)
            if not operation.get("parameters") and "requestBody" not in operation:
                operation.get("responses", {}).pop("422", None)
            if (method, path) not in roles:
                continue
            allowed = roles[method, path]
            if allowed is None:
                line = "No token needed."
            else:
                operation["x-jobq-roles"] = allowed
                line = f"Roles, when tokens are configured: {', '.join(allowed)}."
            operation["description"] = f"{operation.get('description', '').rstrip()}\n\n{line}".lstrip()
    schemas = document.get("components", {}).get("schemas", {})
    for name, model in _models().items():
        extra = model.model_config.get("json_schema_extra")
        if name in schemas and isinstance(extra, dict) and "examples" in extra:
            schemas[name]["examples"] = extra["examples"]
    text = str(document["paths"])
    for name in FASTAPI_VALIDATION:
        if f"#/components/schemas/{name}'" not in text:
            schemas.pop(name, None)


def _problems_as_sent(operation: dict[str, Any]) -> None:
    """Each error answer's schema under `application/problem+json` only."""
    for response in operation.get("responses", {}).values():
        content = response.get("content", {})
        if PROBLEM_JSON in content and JSON in content:
            content[PROBLEM_JSON] = content.pop(JSON)


def _models() -> dict[str, type[BaseModel]]:
    """jobq's models by name, as the document's components are named."""
    found: dict[str, type[BaseModel]] = {}
    classes = [BaseModel]
    while classes:
        for cls in classes.pop().__subclasses__():
            classes.append(cls)
            if cls.__module__.startswith("app."):
                found[cls.__name__] = cls
    return found


def _roles(route: APIRoute, router: APIRouter) -> list[str] | None:
    """The roles a route's role check admits (app/http/auth.py `allow`), in Role's order; None for a route
    without one (the health probes)."""
    for depends in (*router.dependencies, *route.dependencies):
        admits = getattr(depends.dependency, "admits", None)
        if admits is not None:
            return [role.value for role in Role if role in admits.roles]
    return None
