"""Jobs a test puts on a worker's queue beside Switchboard's own."""

from __future__ import annotations

import time


def dawdle(seconds: float) -> str:
    """Take `seconds` in short sleeps: an exception raised in the job's thread (at its next
    Python instruction) or greenlet (where it waits) reaches it within one of them."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)
    return "finished"


def hog(seconds: float) -> str:
    """Compute for `seconds` without a wait: nothing else in a gevent worker runs meanwhile."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "finished"


def churn(seconds: float) -> str:
    """Compute in slices of 20 ms with a short wait between them, as a busy slot does: a
    signal that comes meanwhile is most often handled in this job's thread or greenlet."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        spell = time.monotonic() + 0.02
        while time.monotonic() < spell:
            pass
        time.sleep(0.001)
    return "finished"
