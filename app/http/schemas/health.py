"""The bodies of /healthz and /readyz: whether the process is up, and whether the database answers on a
schema this build runs on, with what holds back its vacuum.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class Health(BaseModel):
    status: str = Field(description='"ok": the process is up (the database is not asked).')


class HorizonHolder(BaseModel):
    holder: str = Field(description="session, replication_slot or prepared_transaction.")
    pid: int | None = Field(description="The session's process id (a slot's: of its walsender, if active).")
    name: str | None = Field(description="The session's application_name, the slot's name, or the gid.")
    state: str | None = Field(description="The session's state (e.g. idle in transaction), or the slot's.")
    seconds: float | None = Field(description="How long its transaction has been open (null: no such time).")
    xid_age: int = Field(description="How many transactions old its xmin is.")
    query: str | None = Field(description="The session's last statement, cut at 200 characters.")


class JobsTableHealth(BaseModel):
    live_tuples: int = Field(description="Live rows (statistics estimate).")
    dead_tuples: int = Field(description="Rows dead and not yet vacuumed (statistics estimate).")
    bytes: int = Field(description="The jobs table's heap.")
    claim_index_bytes: int = Field(description="Size of the index leases claim jobs by, in bytes.")
    since_vacuum_seconds: float | None = Field(description="Since its last vacuum; null: none recorded.")


class DatabaseHealth(BaseModel):
    as_of: datetime | None = Field(description="When this replica last read it (every metrics interval).")
    oldest_snapshot: HorizonHolder | None = Field(
        description="What holds back vacuum of jobq's tables furthest: the oldest xmin in the database."
    )
    holding_back: bool = Field(description="Open a minute or more (a slot: 1,000,000 transactions).")
    jobs_table: JobsTableHealth | None = Field(
        description="The jobs table's rows, size and last vacuum; null before this replica first read them."
    )


class Readiness(BaseModel):
    ready: bool = Field(
        description="True: the database answers and this build runs on its schema. Otherwise the answer is "
        "503 unavailable, with ready false and these same fields beside the problem's."
    )
    database: bool = Field(description="The database answered.")
    schema_revision: str | None = Field(
        description="The schema's migration revision; null while the database is unreachable or before the "
        "first migration."
    )
    expected_revision: str = Field(
        description="This build's head revision: the schema may be at it or at a newer, compatible one."
    )
    compatible: bool | None = Field(
        default=None,
        description="Whether this build can run on the schema (null while the database is unreachable).",
    )
    compatible_from: str | None = Field(
        default=None,
        description="The oldest code revision the schema runs, as its migration recorded it; null: unknown.",
    )
    database_health: DatabaseHealth | None = Field(
        default=None,
        description="What holds back vacuum, and the jobs table's state, as of this replica's last metrics "
        "read. Details only: readiness does not depend on them.",
    )
