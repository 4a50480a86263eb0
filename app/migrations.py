"""Running the Alembic chain from code (`jobq migrate`, service start-up, tests)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from alembic.config import Config

from alembic import command
from app.settings import sqlalchemy_url

ROOT = Path(__file__).resolve().parent.parent


def alembic_config(dsn: str) -> Config:
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(ROOT / "alembic"))
    # ConfigParser treats % as interpolation; a password may contain one.
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(dsn).replace("%", "%%"))
    return config


def upgrade(dsn: str, revision: str = "head") -> None:
    """Bring the schema to `revision`. Blocking: call it from a thread when an event loop is running."""
    command.upgrade(alembic_config(dsn), revision)


def downgrade(dsn: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(dsn), revision)


@cache
def head_revision() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("postgresql://unused")).get_current_head()
