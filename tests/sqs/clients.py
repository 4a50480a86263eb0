"""boto3 clients of jobq's SQS API, in both of SQS's wire formats: JSON 1.0 (the installed botocore) and
the Query protocol (botocore on SQS's older service model, `query_model`).

A new botocore session reads and parses its JSON data (the service model, endpoints, partitions, retry
rules) again before its first client, a few hundred milliseconds; a session that has them makes a client
in a few. So the clients come from one session per service model for the whole test process, and each
test still makes its own: a client's endpoint, credentials, region and configuration are its own, and so
are the event handlers a test registers on it (a client's events are a copy of its session's). A session
is not made to be used from several threads at once, so clients are made under a lock (some tests make
them in threads of their own).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path

import boto3
import botocore.session
import pytest
from botocore.config import Config

from tests.fixtures import tool_missing

BOTOCORE = "1.29.165"  # the last botocore line whose SQS model is the Query protocol's
MODEL = "botocore/data/sqs/2012-11-05/service-2.json"

# For tests run once in each wire format: `@pytest.fixture(params=PROTOCOLS)` and `client_for`.
PROTOCOLS = ["json", "query"]

_lock = threading.Lock()
_sessions: dict[str | None, boto3.Session] = {}


def _session(model: Path | None) -> boto3.Session:
    """The process's session for the installed SQS model (`None`) or the one in the data directory
    `model`; call with `_lock` held."""
    key = None if model is None else str(model)
    if key not in _sessions:
        core = botocore.session.Session()
        if key is not None:
            core.get_component("data_loader").search_paths.insert(0, key)
        _sessions[key] = boto3.Session(botocore_session=core)
    return _sessions[key]


def make_client(
    url: str,
    *,
    key: str = "test",
    secret: str = "test",
    region: str = "us-east-1",
    model: Path | None = None,
    config: Config | None = None,
):
    """A boto3 SQS client of its own for the service at `url`, signing as `key` with `secret` in
    `region`; in the Query protocol when `model` is given."""
    with _lock:
        return _session(model).client(
            "sqs",
            endpoint_url=url,
            region_name=region,
            aws_access_key_id=key,
            aws_secret_access_key=secret,
            config=config or Config(retries={"max_attempts": 1}, read_timeout=30),
        )


def sqs_client(url: str, **credentials: str):
    """boto3 in the JSON protocol, signing as `key` with `secret` (both "test" unless given)."""
    return make_client(url, key=credentials.get("key", "test"), secret=credentials.get("secret", "test"))


def query_client(url: str, model: Path, key: str = "test", secret: str = "test"):
    """boto3 in the Query protocol, on the service model of `query_model`."""
    client = make_client(url, key=key, secret=secret, model=model)
    assert client.meta.service_model.protocol == "query"
    return client


@pytest.fixture(scope="session")
def query_model() -> Path:
    """A botocore data directory holding SQS's Query-protocol model alone, taken from botocore's wheel
    on PyPI once per machine into ~/.cache/jobq-tests."""
    home = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "jobq-tests"
    data = home / f"sqs-query-model-{BOTOCORE}"
    if not data.exists():
        home.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=home) as tmp:
            pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"botocore=={BOTOCORE}"]
            ran = subprocess.run([*pip, "-d", tmp], capture_output=True, text=True, timeout=300)
            if ran.returncode != 0:
                tool_missing(f"cannot download botocore {BOTOCORE} from PyPI for its SQS model: {ran.stderr}")
            (wheel,) = Path(tmp).glob("botocore-*.whl")
            staging = Path(tmp) / "data"
            target = staging / "sqs" / "2012-11-05" / "service-2.json"
            target.parent.mkdir(parents=True)
            with zipfile.ZipFile(wheel) as archive:
                target.write_bytes(archive.read(MODEL))
            try:
                staging.rename(data)
            except OSError:  # another run put it there meanwhile
                assert data.exists()
    return data


def client_for(request: pytest.FixtureRequest, service) -> object:
    """boto3 in the wire format of `request.param`: JSON 1.0 or the Query protocol."""
    if request.param == "json":
        return sqs_client(service.url)
    return query_client(service.url, request.getfixturevalue("query_model"))
