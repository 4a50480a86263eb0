"""The deployment recipes in deploy/ (Docker cannot run here): the Compose file and the PgBouncer
configuration parse, and every jobq setting they name exists, with a value jobq accepts."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import yaml

from app.settings import Settings

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def test_the_compose_file(monkeypatch):
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "pgbouncer", "jobq"}
    jobq = services["jobq"]
    assert (DEPLOY / jobq["build"] / "Dockerfile").exists()
    environment = jobq["environment"]
    fields = {f"JOBQ_{name.upper()}" for name in Settings.model_fields}
    assert set(environment) <= fields, set(environment) - fields
    # Read as jobq reads its environment, with the variables Compose fills in given.
    for name, value in environment.items():
        given = {"JOBQ_ADMIN_TOKEN": "t0ken"}
        monkeypatch.setenv(name, re.sub(r"\$\{(\w+)[^}]*\}", lambda m: given.get(m[1], "secret"), value))
    settings = Settings()
    assert settings.tokens["t0ken"].role == "admin"
    assert settings.pooled_transactions
    assert settings.session_url(settings.database_url or "").startswith(
        "postgresql://jobq:secret@postgres:5432/"
    )
    assert "pgbouncer:6432" in (settings.database_url or "")
    # Every service it depends on is defined; the PgBouncer files it mounts are here.
    for service in services.values():
        assert set(service.get("depends_on", {})) <= set(services)
    mounted = [volume.split(":")[0] for volume in services["pgbouncer"]["volumes"]]
    assert (DEPLOY / mounted[0]).exists() and (DEPLOY / "userlist.txt.example").exists()


def test_the_pgbouncer_configuration():
    config = configparser.ConfigParser(inline_comment_prefixes=(";",), comment_prefixes=(";", "#"))
    config.read(DEPLOY / "pgbouncer.ini")
    pgbouncer = config["pgbouncer"]
    assert pgbouncer["pool_mode"] == "transaction"
    assert pgbouncer["listen_port"] == "6432"
    assert "host=postgres" in config["databases"]["jobq"]


def test_every_setting_is_in_the_readme():
    readme = (DEPLOY.parent / "README.md").read_text()
    table = readme[readme.index("## Configuration") :]
    assert [name for name in Settings.model_fields if f"`JOBQ_{name.upper()}`" not in table] == []
