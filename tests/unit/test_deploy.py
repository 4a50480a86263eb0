"""The deployment recipes (no Docker engine or cluster here): the Dockerfile, read as text; the Compose file
and the PgBouncer configuration, parsed; the Kubernetes manifests as `kubectl kustomize` renders them,
validated against Kubernetes' schemas. Every jobq setting they give exists, with a value jobq accepts, and
they fit together: what a URL names is there, what a selector selects is the pods meant."""

from __future__ import annotations

import configparser
import functools
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from pydantic_settings import SettingsError

from app.settings import Settings
from app.telemetry.metrics import Metrics, QueueGauges
from tests.fixtures import tool_missing

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
OVERLAYS = ("plain", "pgbouncer")
# What the tests give for the recipes' secrets.
PASSWORD = "secret"
TOKEN = "t0ken"
# Custom resources, which Kubernetes' own schemas do not cover: KEDA's.
NO_SCHEMA = {"ScaledObject"}
# An image pinned to a release: a version with at least a minor number, never `latest`.
PINNED = re.compile(r"^[\w./-]+:v?\d+\.\d+[\w.-]*$")
# The same, to the patch release (major.minor.patch).
EXACT = re.compile(r"^[\w./-]+:v?\d+\.\d+\.\d+[\w.-]*$")


def jobq_settings(environment: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings as jobq reads them from `environment` alone."""
    for name in os.environ:
        if name.startswith("JOBQ_") or name == "DATABASE_URL":
            monkeypatch.delenv(name)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    return Settings()


def endpoint(url: str | None) -> tuple[str | None, str | None, str | None, int | None, str]:
    parts = urlsplit(url or "")
    return parts.username, parts.password, parts.hostname, parts.port, parts.path


# --- the Dockerfile --------------------------------------------------------------------------------------


@functools.cache
def dockerfile_stages() -> dict[str, dict[str, Any]]:
    """Each stage by name (in order; the last is the default target): its base and its instructions, each
    (INSTRUCTION, arguments) with continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    stages: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, arguments = line.partition(" ")
        instruction, arguments = instruction.upper(), arguments.strip()
        if instruction == "FROM":
            words = arguments.split()  # image [AS name]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else words[0]
            stages[name] = {"base": words[0], "instructions": []}
        else:
            stages[list(stages)[-1]]["instructions"].append((instruction, arguments))
    return stages


def chain(stage: str) -> list[tuple[str, str]]:
    """A stage's instructions with those of the stages it is built on, the first first."""
    stages = dockerfile_stages()
    base = stages[stage]["base"]
    return (chain(base) if base in stages else []) + stages[stage]["instructions"]


def last(stage: str, instruction: str) -> str | None:
    found = [arguments for name, arguments in chain(stage) if name == instruction]
    return found[-1] if found else None


def installs(stage: str) -> str:
    """What the stages a stage copies from install (their RUN lines, joined)."""
    sources = [re.search(r"--from=(\S+)", arguments) for name, arguments in chain(stage) if name == "COPY"]
    return " ".join(
        arguments
        for m in sources
        if m
        for name, arguments in chain(m[1])
        if name == "RUN" and "pip" in arguments
    )


def test_the_dockerfile():
    stages = dockerfile_stages()
    text = (ROOT / "Dockerfile").read_text()
    # Multi-stage, every image from outside pinned to a release.
    assert len(stages) >= 3
    assert "latest" not in text
    for stage in stages.values():
        assert stage["base"] in stages or EXACT.match(stage["base"]), stage["base"]
    # Two targets: the default (the last stage) without the embedded PostgreSQL, `embedded` with it.
    default = list(stages)[-1]
    assert "embedded" in stages and default != "embedded"
    assert "[embedded]" in installs("embedded") and "[embedded]" not in installs(default)
    for target in (default, "embedded"):
        # Run by a user other than root, by number (which Kubernetes' runAsNonRoot can check).
        user = (last(target, "USER") or "root").split(":")[0]
        assert user.isdigit() and int(user) != 0, user
        healthcheck = last(target, "HEALTHCHECK") or ""
        assert "/readyz" in healthcheck and "--start-period" in healthcheck
        assert last(target, "ENTRYPOINT") == '["jobq"]' and last(target, "CMD") == '["serve"]'
    # The embedded server's files on a volume: jobq's data directory, which the image makes for its user.
    environment = " ".join(arguments for name, arguments in chain("embedded") if name == "ENV")
    data_dir = re.search(r"JOBQ_DATA_DIR=(\S+)", environment)
    assert data_dir and last("embedded", "VOLUME") == f'["{data_dir[1]}"]'
    assert f"-o jobq -g jobq -m 0700 {data_dir[1]}" in (last("embedded", "RUN") or "")
    assert "JOBQ_DATABASE_URL" not in environment
    assert "JOBQ_DATA_DIR" not in " ".join(arguments for _, arguments in chain(default))


# --- Compose ---------------------------------------------------------------------------------------------


def interpolated(value: str, given: dict[str, str]) -> str:
    """A value as Compose fills it in from `given` (${NAME}, ${NAME:?error}, ${NAME:-default})."""

    def fill(m: re.Match[str]) -> str:
        name, operator, word = m[1], m[2], m[3]
        if name in given:
            return given[name]
        assert operator == ":-", f"{name} is needed and not given"
        return word

    return re.sub(r"\$\{(\w+)(?:(:[?-])([^}]*))?\}", fill, value)


def test_the_compose_file(monkeypatch):
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "jobq", "pgbouncer", "jobq-pooled"}
    given = {"JOBQ_DB_PASSWORD": PASSWORD, "JOBQ_ADMIN_TOKEN": TOKEN}
    environment = {
        name: {key: interpolated(str(value), given) for key, value in service.get("environment", {}).items()}
        for name, service in services.items()
    }
    # PostgreSQL and jobq by default; PgBouncer, and jobq through it, in the `pgbouncer` profile.
    assert [name for name, service in services.items() if "profiles" not in service] == ["postgres", "jobq"]
    assert services["pgbouncer"]["profiles"] == services["jobq-pooled"]["profiles"] == ["pgbouncer"]
    # Images pinned to a release; jobq's built from this checkout's Dockerfile, a target it has.
    for service in services.values():
        if "build" in service:
            build = service["build"]
            assert (DEPLOY / build["context"] / "Dockerfile").exists()
            assert build["target"] in dockerfile_stages()
        else:
            assert PINNED.match(service["image"]), service["image"]
        assert set(service.get("depends_on", {})) <= set(services)
    fields = {f"JOBQ_{name.upper()}" for name in Settings.model_fields}
    postgres = environment["postgres"]
    user, password, database = (
        postgres["POSTGRES_USER"],
        postgres["POSTGRES_PASSWORD"],
        postgres["POSTGRES_DB"],
    )
    assert password == PASSWORD
    direct = (user, password, "postgres", 5432, f"/{database}")

    # jobq on PostgreSQL itself.
    assert set(environment["jobq"]) <= fields, set(environment["jobq"]) - fields
    settings = jobq_settings(environment["jobq"], monkeypatch)
    assert settings.tokens[TOKEN].role == "admin"
    assert not settings.pooled_transactions
    assert endpoint(settings.database_url) == direct

    # jobq through PgBouncer in transaction mode, its own sessions on PostgreSQL itself.
    assert set(environment["jobq-pooled"]) <= fields, set(environment["jobq-pooled"]) - fields
    settings = jobq_settings(environment["jobq-pooled"], monkeypatch)
    assert settings.tokens[TOKEN].role == "admin"
    assert settings.pooled_transactions
    assert endpoint(settings.session_url(settings.database_url or "")) == direct
    ini = pgbouncer_ini()
    assert endpoint(settings.database_url) == (
        user,
        password,
        "pgbouncer",
        int(ini["pgbouncer"]["listen_port"]),
        f"/{database}",
    )

    # PgBouncer: the database's user and password from the same variables as PostgreSQL's (the image
    # writes its auth_file of them, in plain text for scram-sha-256), its configuration from this
    # directory, no file to write by hand.
    pgbouncer = services["pgbouncer"]
    assert environment["pgbouncer"]["DB_USER"] == user
    assert environment["pgbouncer"]["DB_PASSWORD"] == password
    assert environment["pgbouncer"]["AUTH_TYPE"] == ini["pgbouncer"]["auth_type"] == "scram-sha-256"
    mounts = [volume.split(":") for volume in pgbouncer["volumes"]]
    assert [(DEPLOY / source).exists() for source, *_ in mounts] == [True] * len(mounts)
    assert [target for _, target, *_ in mounts] == ["/etc/pgbouncer/pgbouncer.ini"]
    assert f"host=postgres port=5432 dbname={database}" in ini["databases"][database]
    assert "healthcheck" in pgbouncer and services["jobq-pooled"]["depends_on"]["pgbouncer"]


@functools.cache
def pgbouncer_ini() -> configparser.ConfigParser:
    config = configparser.ConfigParser(inline_comment_prefixes=(";",), comment_prefixes=(";", "#"))
    config.read(DEPLOY / "pgbouncer.ini")
    return config


def test_the_pgbouncer_configuration():
    config = pgbouncer_ini()
    pgbouncer = config["pgbouncer"]
    assert pgbouncer["pool_mode"] == "transaction"
    assert pgbouncer["listen_port"] == "6432"
    assert pgbouncer["auth_file"] == "/etc/pgbouncer/userlist.txt"
    assert "host=postgres" in config["databases"]["jobq"]


# --- Kubernetes ------------------------------------------------------------------------------------------


def render(directory: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return [document for document in yaml.safe_load_all(done.stdout) if document]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    """Each overlay, and the KEDA example, as kubectl renders it, every object valid by Kubernetes' schemas
    (strict: no field they do not know), on the oldest and the newest Kubernetes kubernetes-validate knows."""
    if not shutil.which("kubectl"):
        tool_missing("needs kubectl (Debian's kubernetes-client)")
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    from kubernetes_validate.utils import all_versions, latest_version

    directories = {name: KUBERNETES / "overlays" / name for name in OVERLAYS} | {
        "keda": KUBERNETES / "examples" / "keda"
    }
    with ThreadPoolExecutor(len(directories)) as pool:
        objects = dict(zip(directories, pool.map(render, directories.values()), strict=True))
    oldest = min(all_versions(), key=lambda version: tuple(map(int, version.split("."))))
    invalid = []
    for name, documents in objects.items():
        for document in documents:
            if document["kind"] in NO_SCHEMA:
                continue
            for version in (oldest, latest_version()):
                try:
                    kubernetes_validate.validate(document, version, strict=True)
                except kubernetes_validate.ValidationError as error:
                    kind, named = document["kind"], document["metadata"]["name"]
                    invalid.append(f"{name}: {kind} {named} (Kubernetes {version}): {error.message}")
    assert invalid == []
    return objects


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind} {name}: {len(matches)} found"
    return matches[0]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and selector.items() <= labels.items()


def container_environment(
    objects: list[dict[str, Any]], container: dict[str, Any], secrets: dict[str, str]
) -> dict[str, str]:
    """A container's environment as the kubelet makes it: envFrom (each ConfigMap and Secret it names
    must be among `objects`; the Secret's values replaced by `secrets`), then env with $(NAME) expanded."""
    environment: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            environment |= find(objects, "ConfigMap", source["configMapRef"]["name"])["data"]
        else:
            secret = find(objects, "Secret", source["secretRef"]["name"])
            environment |= {key: secrets.get(key, value) for key, value in secret["stringData"].items()}
    for variable in container.get("env", []):
        if "value" in variable:
            value = re.sub(r"\$\((\w+)\)", lambda m: environment.get(m[1], m[0]), variable["value"])
        else:
            reference = variable["valueFrom"]
            kind, key = ("ConfigMap", "configMapKeyRef") if "configMapKeyRef" in reference else ("Secret", "")
            if kind == "ConfigMap":
                value = find(objects, kind, reference[key]["name"])["data"][reference[key]["key"]]
            else:
                ref = reference["secretKeyRef"]
                value = secrets.get(
                    ref["key"], find(objects, "Secret", ref["name"])["stringData"][ref["key"]]
                )
        environment[variable["name"]] = value
    return environment


def check_hardened(pod: dict[str, Any]) -> None:
    """Non-root, read-only root filesystem, an emptyDir wherever it writes, requests and limits."""
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
    for container in pod["containers"]:
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        for mount in container.get("volumeMounts", []):
            assert "emptyDir" in volumes[mount["name"]]
        assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
        image = container["image"]
        assert PINNED.match(image) and "latest" not in image, image


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_kubernetes_overlays(overlay, rendered, monkeypatch):
    objects = rendered[overlay]
    secrets = {"DB_PASSWORD": PASSWORD, "JOBQ_TOKENS": f'{{"{TOKEN}": "admin"}}'}

    # The service: probes on /readyz (ready) and /healthz (alive), on the port it listens on.
    deployment = find(objects, "Deployment", "jobq")
    assert deployment["spec"]["replicas"] >= 2
    pod = deployment["spec"]["template"]["spec"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selects(deployment["spec"]["selector"]["matchLabels"], labels)
    (jobq,) = pod["containers"]
    assert jobq["command"] == ["jobq", "serve"]
    ports = {port["name"]: port["containerPort"] for port in jobq["ports"]}
    assert jobq["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert jobq["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert jobq[probe]["httpGet"]["port"] in ports
    check_hardened(pod)
    assert {mount["mountPath"] for mount in jobq["volumeMounts"]} == {"/tmp"}

    # Its settings, as jobq reads them: migrations are the Job's, the port the one probed.
    environment = container_environment(objects, jobq, secrets)
    settings = jobq_settings(environment, monkeypatch)
    assert settings.migrate_on_start is False
    assert settings.tokens[TOKEN].role == "admin"
    assert settings.port == 8000 and ports["http"] == 8000
    direct = ("jobq", PASSWORD, "postgres", 5432, "/jobq")
    assert endpoint(settings.session_url(settings.database_url or "")) == direct
    if overlay == "plain":
        assert settings.database_pool_mode == "session"
        assert endpoint(settings.database_url) == direct
    else:
        # Through PgBouncer in transaction mode: a Service of the overlay, selecting PgBouncer's pods,
        # which listen where jobq connects, in transaction mode, as the same user.
        assert environment["JOBQ_DATABASE_POOL_MODE"] == "transaction" and settings.pooled_transactions
        _, _, host, port, _ = endpoint(settings.database_url)
        assert endpoint(settings.database_url) == ("jobq", PASSWORD, host, port, "/jobq")
        service = find(objects, "Service", host or "")
        assert [p["port"] for p in service["spec"]["ports"]] == [port]
        pgbouncer = find(objects, "Deployment", "jobq-pgbouncer")
        pgbouncer_labels = pgbouncer["spec"]["template"]["metadata"]["labels"]
        assert selects(service["spec"]["selector"], pgbouncer_labels)
        assert selects(pgbouncer["spec"]["selector"]["matchLabels"], pgbouncer_labels)
        check_hardened(pgbouncer["spec"]["template"]["spec"])
        (container,) = pgbouncer["spec"]["template"]["spec"]["containers"]
        bouncer = container_environment(objects, container, secrets)
        assert bouncer["POOL_MODE"] == "transaction" and int(bouncer["LISTEN_PORT"]) == port
        assert (bouncer["DB_USER"], bouncer["DB_PASSWORD"], bouncer["DB_HOST"]) == (
            "jobq",
            PASSWORD,
            "postgres",
        )
        assert bouncer["AUTH_TYPE"] == "scram-sha-256"
        assert {mount["mountPath"] for mount in container["volumeMounts"]} == {"/etc/pgbouncer"}
        pdb = find(objects, "PodDisruptionBudget", "jobq-pgbouncer")
        assert selects(pdb["spec"]["selector"]["matchLabels"], pgbouncer_labels)

    # The Service and the PodDisruptionBudget select the service's pods, and no other pods.
    service = find(objects, "Service", "jobq")
    pdb = find(objects, "PodDisruptionBudget", "jobq")
    other_pods = [
        o["spec"]["template"]["metadata"]["labels"]
        for o in objects
        if "template" in o.get("spec", {}) and o is not deployment
    ]
    for selector in (service["spec"]["selector"], pdb["spec"]["selector"]["matchLabels"]):
        assert selects(selector, labels)
        assert not any(selects(selector, other) for other in other_pods)
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]

    # The migration Job: `jobq migrate` on PostgreSQL itself, in a session of its own.
    job = find(objects, "Job", "jobq-migrate")
    job_pod = job["spec"]["template"]["spec"]
    (migrate,) = job_pod["containers"]
    assert migrate["command"] == ["jobq", "migrate"] and job_pod["restartPolicy"] in ("Never", "OnFailure")
    assert migrate["image"] == jobq["image"]
    check_hardened(job_pod)
    settings = jobq_settings(container_environment(objects, migrate, secrets), monkeypatch)
    assert not settings.pooled_transactions and endpoint(settings.database_url) == direct
    # A rollout applies all but the service's objects first (the Job among them), then the rest.
    assert job["metadata"]["labels"]["app.kubernetes.io/component"] != "server"
    assert deployment["metadata"]["labels"]["app.kubernetes.io/component"] == "server"

    # The Secret as shipped holds placeholders jobq refuses to start with.
    with pytest.raises(SettingsError, match='"tokens"'):
        jobq_settings(container_environment(objects, jobq, {}), monkeypatch)


def test_the_keda_example(rendered):
    objects = rendered["keda"]
    (scaled,) = [o for o in objects if o["kind"] == "ScaledObject"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    worker = find(objects, "Deployment", scaled["spec"]["scaleTargetRef"]["name"])
    check_hardened(worker["spec"]["template"]["spec"])
    (container,) = worker["spec"]["template"]["spec"]["containers"]
    assert container["command"][:2] == ["jobq", "worker"]
    queue = container["command"][container["command"].index("--queue") + 1]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and float(trigger["metadata"]["threshold"]) > 0
    # The query asks for a series jobq exports: the queue's pending jobs.
    series = re.search(r"(\w+)\{([^}]*)\}", trigger["metadata"]["query"])
    assert series, trigger["metadata"]["query"]
    wanted = dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', series[2]))
    assert wanted == {"queue": queue, "state": "pending"}
    metrics = Metrics()
    row = {
        "queue": queue,
        "paused": False,
        "lag_seconds": 0.0,
        "pending": 7,
        "scheduled": 0,
        "running": 0,
        "waiting": 0,
        "dead": 0,
    }
    metrics.refreshed(QueueGauges(queues=[row]))
    exposition = metrics.exposition().decode()
    assert f'{series[1]}{{queue="{queue}",state="pending"}} 7.0' in exposition
    # The worker reaches the jobq Service of the overlays.
    assert {"name": "JOBQ_URL", "value": "http://jobq:8000"} in container["env"]
    assert find(rendered["plain"], "Service", "jobq")["spec"]["ports"][0]["port"] == 8000
