"""The fixtures of tests/fixtures.py, for every test: the server's (tests/) and the client's
(clients/python/tests/), so that one session shares one PostgreSQL and one migrated template."""

pytest_plugins = ["tests.fixtures"]
