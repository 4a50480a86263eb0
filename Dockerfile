# jobq against your PostgreSQL:
#   docker run -e JOBQ_DATABASE_URL=postgresql://user:pass@host/db -e JOBQ_TOKENS='{"<token>": "admin"}' \
#              -p 8000:8000 jobq
# It listens on 0.0.0.0 inside the container, so it needs tokens (or JOBQ_ALLOW_INSECURE=true).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# The client (the `jobq` command) and the server, installed as wheels, as from a package index: the
# migrations and the dashboard's files come with the package, so nothing of the sources stays behind.
WORKDIR /tmp/jobq-src
COPY clients/python ./clients/python
COPY pyproject.toml README.md ./
COPY app ./app
RUN pip install ./clients/python . \
 && rm -rf /tmp/jobq-src \
 && useradd --system --uid 10001 --home-dir /srv/jobq jobq \
 && mkdir -p /srv/jobq/.jobq && chown jobq /srv/jobq/.jobq

WORKDIR /srv/jobq
USER jobq
ENV JOBQ_HOST=0.0.0.0 JOBQ_PORT=8000
EXPOSE 8000
# Migrations first (idempotent; concurrent replicas take turns), then the server.
CMD ["sh", "-c", "jobq migrate && exec jobq serve"]
