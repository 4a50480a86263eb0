"""Flow control through the Python client (jobq/client.py) and the `jobq queues` commands (jobq/cli.py),
against a real service and database: queue settings set and removed, a key's own limits, the key list,
and the limit holding on leases."""

from __future__ import annotations

import json

from jobq import Client, NotFound
from jobq.types import NO_LIMIT, KeyView, Rate
from tests.command_line import invoke

KEY = "tenant/42 ü"  # quoted in the path


def test_settings_keys_and_the_limit_through_the_client(service):
    with Client(service.url) as jobq:
        settings = jobq.admin.configure_queue(
            "f", key_concurrency=1, fair=True, key_rate=Rate(100, 60)
        ).settings
        assert (settings.key_concurrency, settings.fair, settings.rate, settings.key_rate) == (
            1,
            True,
            None,
            Rate(100, 60.0),
        )
        for _ in range(3):
            jobq.enqueue("f", {}, key=KEY)
        jobq.enqueue("f", {}, key="other")
        assert sorted(j.key or "" for j in jobq.worker.lease("f", max_jobs=10)) == ["other", KEY]
        assert jobq.admin.set_key("f", KEY, concurrency=2) == KeyView("f", KEY, 2, None, 2, 1)
        assert [j.key for j in jobq.worker.lease("f", max_jobs=10)] == [KEY]
        assert [k.key for k in jobq.admin.keys("f", limit=1)] == [KEY]
        assert jobq.admin.key("f", KEY).running == 2
        assert jobq.admin.delete_key("f", KEY).deleted is True
        try:
            jobq.admin.delete_key("f", KEY)
            raise AssertionError("a second delete should be NotFound")
        except NotFound:
            pass
        cleared = jobq.admin.configure_queue(
            "f", key_concurrency=NO_LIMIT, fair=False, key_rate=NO_LIMIT
        ).settings
        assert (cleared.key_concurrency, cleared.fair, cleared.key_rate) == (None, False, None)


def test_the_queues_commands(service):
    url = ["--url", service.url]
    done = invoke(["queues", "configure", "f", "--key-concurrency", "2", "--rate", "10/1.5", "--fair", *url])
    assert done.exit_code == 0, done.output
    assert "key_concurrency 2" in done.output and "rate 10/1.5s" in done.output and "fair true" in done.output
    done = invoke(["queues", "configure", "f", "--rate", "ten a minute", *url])
    assert done.exit_code == 2 and "LIMIT/SECONDS" in done.output
    done = invoke(["queues", "configure", "f", "--key-concurrency", "0", "--rate", "none", *url])
    assert "key_concurrency" not in done.output and "rate" not in done.output and "fair true" in done.output
    done = invoke(["queues", "set-key", "f", "vip", "--concurrency", "5", "--json", *url])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["concurrency"] == 5
    done = invoke(["queues", "keys", "f", *url])
    assert done.exit_code == 0 and "vip" in done.output
    done = invoke(["queues", "set-key", "f", "vip", "--delete", *url])
    assert done.exit_code == 0 and "the queue's limits" in done.output
