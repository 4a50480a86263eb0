# jobq against your PostgreSQL:
#   docker run -e JOBQ_DATABASE_URL=postgresql://user:pass@host/db -e JOBQ_TOKENS='{"<token>": "admin"}' \
#              -p 8000:8000 jobq
# It listens on 0.0.0.0 inside the container, so it needs tokens (or JOBQ_ALLOW_INSECURE=true).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /srv/jobq
COPY pyproject.toml README.md alembic.ini ./
COPY alembic ./alembic
COPY app ./app
RUN pip install -e . \
 && useradd --system --uid 10001 --home-dir /srv/jobq jobq \
 && mkdir .jobq && chown jobq .jobq

USER jobq
ENV JOBQ_HOST=0.0.0.0 JOBQ_PORT=8000
EXPOSE 8000
# Migrations first (idempotent; concurrent replicas take turns), then the server.
CMD ["sh", "-c", "jobq migrate && exec jobq serve"]
