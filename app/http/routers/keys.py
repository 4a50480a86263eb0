"""Keys of a queue under flow control (app/service/flow.py): the keys with the most jobs waiting, one key's
jobs and overrides, and setting or removing a key's own limits.

Viewers read them; admins change them. A token limited to some queues is refused (403) a queue outside
them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from starlette.convertors import PathConvertor, register_url_convertor

from app.core.limits import MAX_KEY, MAX_QUEUE_NAME, QUEUE_NAME_PATTERN
from app.http.auth import Admin, Caller, QueueReader
from app.http.deps import DB, RuntimeDep, answers
from app.http.fastpath.route import JobqRoute
from app.http.openapi import operation_id
from app.http.schemas import DeletedKey, KeyList, KeyOverrides, KeyView
from app.http.web import JSONBody
from app.service import flow

router = APIRouter(
    tags=["operators"],
    route_class=JobqRoute,
    default_response_class=JSONBody,
    generate_unique_id_function=operation_id,
)
QueuePath = Annotated[str, Path(pattern=QUEUE_NAME_PATTERN, max_length=MAX_QUEUE_NAME)]
# Any text of 1-256 characters, percent-encoded in the path (a '/' in a key as %2F, or as it is).
KeyPath = Annotated[str, Path(min_length=1, max_length=MAX_KEY, examples=["tenant-42"])]
MAX_KEY_LIST = 500


@router.get(
    "/queues/{queue}/keys", dependencies=[QueueReader], response_model=None, responses=answers(KeyList)
)
async def list_keys(
    queue: QueuePath,
    db: DB,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=MAX_KEY_LIST, description="Keys to list, at most.")] = 50,
) -> JSONBody:
    """The queue's keys with the most jobs waiting (then running) first, and keys with overrides."""
    caller.admit(queue)
    return JSONBody({"keys": await flow.list_keys(db, queue, limit)})


class KeyConvertor(PathConvertor):
    """A key as the rest of the path: any text, a '/' and a line break included (Starlette's `path`
    stops at a line break, so a key holding one, which a job may carry, answered 404 no route)."""

    regex = r"[\s\S]*"


register_url_convertor("key", KeyConvertor())
KEY_ROUTE = "/queues/{queue}/keys/{key:key}"


@router.get(KEY_ROUTE, dependencies=[QueueReader], response_model=None, responses=answers(KeyView, 404))
async def get_key(queue: QueuePath, key: KeyPath, db: DB, caller: Caller) -> JSONBody:
    """A key's jobs waiting and running, and its overrides."""
    caller.admit(queue)
    return JSONBody(await flow.get_key(db, queue, key))


@router.put(KEY_ROUTE, dependencies=[Admin], response_model=None, responses=answers(KeyView))
async def put_key(
    queue: QueuePath, key: KeyPath, body: KeyOverrides, runtime: RuntimeDep, caller: Caller
) -> JSONBody:
    """Give a key its own concurrency and rate in place of the queue's key_concurrency and key_rate (an
    absent or null one: the queue's). Replaces the key's overrides; creates the queue if need be."""
    caller.admit(queue)
    rate = (body.rate.limit, body.rate.period) if body.rate is not None else None
    return JSONBody(await flow.put_key(runtime, queue, key, body.concurrency, rate))


@router.delete(KEY_ROUTE, dependencies=[Admin], response_model=None, responses=answers(DeletedKey, 404))
async def delete_key(queue: QueuePath, key: KeyPath, runtime: RuntimeDep, caller: Caller) -> JSONBody:
    """Remove a key's overrides: it follows the queue's settings again."""
    caller.admit(queue)
    return JSONBody(await flow.delete_key(runtime, queue, key))
