"""Heartbeats: how often a running job says it is alive, how long silence means it is dead, the thread that
beats, and the name a worker holds its claims under."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Callable
from typing import Any


def heartbeat_interval() -> int:
    """Seconds between a running trial's heartbeats; a trial silent for the grace period is stale."""
    return max(1, int(os.environ.get("ILR_SEARCH_HEARTBEAT_SECONDS", "10")))


def grace_period() -> int:
    """Several intervals, so that a loaded machine that delays a beat or two does not fail a live trial."""
    return 4 * heartbeat_interval() + 1


class Heartbeat:
    """Calls `beat()` at once and then every heartbeat interval from a daemon thread, until the context exits
    or `beat` returns False (what it beats for is over). A transient error skips one beat, never ends them."""

    def __init__(self, beat: Callable[[], bool]) -> None:
        self._beat_once = beat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            try:
                if self._beat_once() is False:
                    return
            except Exception:  # a lock, a full disk for a moment: beat again next interval
                pass
            if self._stop.wait(heartbeat_interval()):
                return

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()


def new_worker() -> str:
    """A name for this worker in the claims it holds: host, process and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
