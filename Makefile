# The two commands a newcomer needs:  `make serve`  and  `make test`.
# Both create .venv and install jobq into it on first use (and again when a pyproject.toml changes): the
# client (clients/python, the `jobq` distribution) and the server (this directory, `jobq-server`, which
# depends on the client), both editable.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: serve test openapi bench soak clean

INSTALL := $(BIN)/python -m pip install --quiet -e clients/python

$(VENV)/.installed: pyproject.toml clients/python/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(INSTALL) -e '.[test]'
	touch $@

# Run the service on 127.0.0.1:8000 (embedded PostgreSQL under ./.jobq unless JOBQ_DATABASE_URL is set).
serve: $(VENV)/.installed
	$(BIN)/jobq serve

# Run the whole suite, the server's tests and the client's (embedded PostgreSQL unless
# JOBQ_TEST_DATABASE_URL names a server to use), in TEST_WORKERS processes (pytest-xdist; 0 runs it in
# this one). Each process has a server, databases and ports of its own: most of a test's time is spent
# waiting (long-polls, services starting, visibility timeouts), so on two cores two processes take 0.6
# of the time one takes.
TEST_WORKERS ?= 2
test: $(VENV)/.installed
	$(BIN)/pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

# Regenerate the committed openapi.json from the app.
openapi: $(VENV)/.installed
	$(BIN)/jobq openapi > openapi.json

# The benchmark suite against the local PostgreSQL (JOBQ_BENCH_DATABASE_URL), a few minutes; see bench/run.py.
bench: $(VENV)/.installed
	$(INSTALL) -e '.[test,bench]'
	$(BIN)/python bench/run.py $(BENCH_ARGS)

# Minutes of steady mixed load, watching memory, latency and table size; see bench/soak.py.
soak: $(VENV)/.installed
	$(INSTALL) -e '.[test,bench]'
	$(BIN)/python bench/soak.py $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
