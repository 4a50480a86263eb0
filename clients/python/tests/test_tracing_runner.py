"""Without a tracer provider the runner runs handlers as they are: tracing costs nothing then."""

from jobq.tracing import active, traced


def test_handlers_run_unwrapped_without_a_tracer_provider():
    def handle(job):
        return job

    async def handle_async(job):
        return job

    assert not active()
    assert traced(handle, False) is handle and traced(handle_async, True) is handle_async
