"""What readiness (GET /readyz, app/http/routers/health.py) asks the database."""

from __future__ import annotations

import asyncpg

from app.db import sql as q
from app.db.pool import Database


async def schema_revision(db: Database) -> tuple[str | None, str | None]:
    """The schema's revision and the floor recorded with it (both None before any migration)."""
    async with db.acquire() as conn:
        try:
            row = await conn.fetchrow(q.SCHEMA_REVISION.text)
        except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError):
            return None, None
    return row["revision"], row["floor"]
