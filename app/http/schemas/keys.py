"""The bodies of a queue's keys (GET/PUT/DELETE /queues/{queue}/keys): a key's own limits in place of
its queue's, and what each key has waiting and running.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from app.http.schemas.common import Body, KeyConcurrency, Rate


class KeyOverrides(Body):
    """A key's own limits, in place of the queue's key_concurrency and key_rate (null: the queue's)."""

    concurrency: KeyConcurrency | None = Field(
        default=None,
        description="At most this many of the key's jobs running at once (1-100,000), in place of the "
        "queue's key_concurrency. Null or absent: the queue's.",
    )
    rate: Rate | None = Field(
        default=None,
        description="The key's own rate, in place of the queue's key_rate. Null or absent: the queue's.",
    )


class KeyView(BaseModel):
    queue: str = Field(description="The key's queue.")
    key: str = Field(description="The key.")
    concurrency: int | None = Field(description="The key's own concurrency; null: the queue's.")
    rate: Rate | None = Field(description="The key's own rate; null: the queue's key_rate.")
    pending: int = Field(description="Jobs of the key waiting (ready or scheduled).")
    running: int = Field(description="Jobs of the key running now.")


class KeyList(BaseModel):
    keys: list[KeyView] = Field(description="Keys with most jobs waiting first, then those with overrides.")


class DeletedKey(BaseModel):
    queue: str = Field(description="The key's queue.")
    key: str = Field(description="The key, which follows the queue's settings again.")
    deleted: bool = Field(description="Always true: a key without overrides is 404.")
