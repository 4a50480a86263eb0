"""jobq: an HTTP job queue on PostgreSQL.

The package is in layers, each a folder that imports only the layers below it (the contract is
``[tool.importlinter]`` in pyproject.toml, checked by tests/unit/test_layers.py):

- ``main``, ``cli``: wiring. ``create_app(settings)`` and its lifespan; the ``jobq serve``, ``migrate``
  and ``openapi`` commands.
- ``ui`` (the dashboard) and ``sqs`` (the Amazon SQS wire protocols): beside each other, on top of ``http``.
- ``http``: routers, request and answer schemas, problem details, middleware, and ``fastpath``, the only
  user of FastAPI's and uvicorn's internals.
- ``service``: every operation, in terms of ``db``; no HTTP, no SQS wire format. Its ``loops`` are the
  background work each process does.
- ``db``: the pool, the tables, the SQL, the migrations.
- ``telemetry``: metrics and traces.
- ``settings``, ``startup``: the ``JOBQ_*`` settings, and start-up failures told in one line.
- ``core``: pure rules, no I/O: job statuses, limits, errors, roles and scopes, cron, lease tokens, JSON text.

One name runs through the layers: ``POST /ack`` -> ``app/http/routers/workers.py: ack`` ->
``app.service.ack`` -> the ``ACK`` statement.
"""

from importlib.metadata import PackageNotFoundError, version

# The version is pyproject.toml's, read from the installed distribution: written in one place.
try:
    __version__ = version("jobq-server")
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"
