"""A per-test deadline for the client suites (tests/e2b, tests/aio): a test
still running past it fails loudly instead of hanging the run.

`@pytest.mark.deadline(N)` gives one test N seconds instead of the suite's
default.
"""

import faulthandler
import signal

import pytest


class DeadlineExceeded(Exception):
    pass


def deadline_fixture(default_seconds):
    """An autouse fixture failing the test (SIGALRM in the main thread)
    past its deadline."""

    @pytest.fixture(autouse=True)
    def deadline(request):
        marker = request.node.get_closest_marker("deadline")
        seconds = int(marker.args[0]) if marker else default_seconds

        def expired(signum, frame):
            raise DeadlineExceeded(
                f"{request.node.nodeid} still running after {seconds}s: a hang"
            )

        previous = signal.signal(signal.SIGALRM, expired)
        signal.alarm(seconds)
        # A call blocked outside Python may never see the alarm: then, a
        # little later, dump every thread's stack and end the run (a loud
        # failure, not a hang).
        faulthandler.dump_traceback_later(seconds + 30, exit=True)
        try:
            yield seconds
        finally:
            faulthandler.cancel_dump_traceback_later()
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)

    return deadline
