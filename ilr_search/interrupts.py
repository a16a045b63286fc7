"""Ctrl-C that is never lost.

Python turns SIGINT into a KeyboardInterrupt raised wherever the main thread is at the time. When that is inside a
finalizer or a weakref callback (a garbage collection during training runs SQLAlchemy's), the interpreter prints
"Exception ignored" and drops it, and the run trains on as if nothing happened. Inside `recorded()`, SIGINT raises
KeyboardInterrupt as Python's own handler does and is also recorded, and the training loops raise it again at their
next window of steps (`raise_if_interrupted`), in whichever thread trains. A recorded KeyboardInterrupt that Python
drops is not printed either (no traceback on Ctrl-C); every other dropped exception goes to the hook that was there.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

_interrupted = threading.Event()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _interrupted.set()
    raise KeyboardInterrupt


@contextlib.contextmanager
def recorded() -> Iterator[None]:
    """SIGINT recorded as well as raised while inside (from the main thread, over Python's own handler only: a
    handler someone else set is left alone); the handler and the record are undone on the way out."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    _interrupted.clear()
    previous = signal.signal(signal.SIGINT, _on_sigint)
    previous_hook = sys.unraisablehook

    def unraisable(dropped: sys.UnraisableHookArgs) -> None:
        if not (isinstance(dropped.exc_value, KeyboardInterrupt) and _interrupted.is_set()):
            previous_hook(dropped)

    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGINT, previous)
        _interrupted.clear()


def raise_if_interrupted() -> None:
    """Raise KeyboardInterrupt if a SIGINT was recorded (its own KeyboardInterrupt may have been dropped)."""
    if _interrupted.is_set():
        raise KeyboardInterrupt
