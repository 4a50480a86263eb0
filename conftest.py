"""The fixtures of tests/fixtures.py, for every test: the server's (tests/) and the client's
(clients/python/tests/), so that one session shares one PostgreSQL and one migrated template."""

pytest_plugins = ["tests.fixtures"]


def pytest_collection_modifyitems(items: list) -> None:
    """The system tests (processes, replicas, faults, browsers) and those marked slow first: most take
    seconds, and started last one of them would keep the run going after the other processes of
    pytest-xdist ran out of tests."""
    items.sort(key=lambda item: not ("/tests/system/" in str(item.path) or item.get_closest_marker("slow")))
