"""The one wait loop of the modules that wait for a state they do not control (the endpoint's view of a replica,
vLLM's in-flight gauges): read, test, sleep, until the test passes or the time is up - never longer, and always
one read after the last sleep, so a state reached at the deadline is seen."""

from __future__ import annotations

import time


def poll_until(read, done, timeout_seconds: float, interval_seconds: float, clock=time.monotonic,
               sleep=time.sleep) -> tuple:
    """Call `read()` until `done(value)` is true or `timeout_seconds` have passed since the first read.

    Returns (the last value read, seconds waited rounded to 0.1, whether `done` held). A timeout of 0 reads once.
    `clock` and `sleep` are the test's to replace."""
    start = clock()
    while True:
        value = read()
        waited = clock() - start
        if done(value):
            return value, round(waited, 1), True
        if waited >= timeout_seconds:
            return value, round(waited, 1), False
        sleep(max(0.0, min(interval_seconds, timeout_seconds - waited)))
