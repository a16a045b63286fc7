"""`run --time-budget` (and `[search] time_budget`): a wall-clock budget for one invocation of `run`.

The budget bounds starts, never a run in flight: the search asks `Deadline.spent()` once each time it would start
new work (a group of trials, of reference runs, of race runs), and starts none once the budget is spent; what is
training finishes and is stored. The budget is how one invocation goes, not what the study is: it is never stored
and never part of the study's identity, so the same command with another budget (or none) opens the same study and
goes on toward its decision.

The clock is one seam, `clock` below (seconds, as `time.time` gives them): the deadline reads nothing else, so a test
sets it to a fake clock (a step-count budget: a clock that moves on each look) and never waits on real time. It is
the wall clock, not a monotonic one, because the deadline crosses processes: `run`'s worker processes are given the
deadline's end and read their own clock against it.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from ilr_search.errors import UserInputError

clock: Callable[[], float] = time.time  # the seam: seconds; the one clock a deadline reads

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
MAX_SECONDS = 366 * 86400.0  # a year: beyond it a budget is a typo, not a plan
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([smhd])")
EXAMPLES = "15m, 90s, 1h, 1.5h, 1h30m or plain seconds such as 900"


def parse_duration(text: str | float | int, what: str = "--time-budget") -> float:
    """A duration in seconds: `15m`, `90s`, `1h`, `1.5h`, `1h30m`, `2d`, or plain seconds (`900`, a TOML number
    too); a UserInputError (naming `what`) for anything else, zero, or more than a year."""
    if isinstance(text, bool):
        raise UserInputError(f"{what} must be a duration ({EXAMPLES}), got {text!r}")
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        raw = text.strip().lower().replace(" ", "")
        try:
            seconds = float(raw)
        except ValueError:
            parts = _PART.findall(raw)
            if not raw or "".join(n + u for n, u in parts) != raw:
                raise UserInputError(f"{what} {text!r} is not a duration; give e.g. {EXAMPLES}") from None
            seconds = math.fsum(float(n) * UNITS[u] for n, u in parts)
    if not math.isfinite(seconds) or seconds <= 0:
        raise UserInputError(f"{what} must be a positive duration ({EXAMPLES}), got {text!r}")
    if seconds > MAX_SECONDS:
        raise UserInputError(f"{what} must be at most a year ({MAX_SECONDS:.0f} seconds), got {text!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """`15m`, `1h 30m`, `1m 30s`, `45s`, `0.5s`: a duration as a person writes it (to the second above one);
    parse_duration reads it back."""
    if seconds < 1:
        return f"{seconds:.2g}s"
    left = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count}{unit}")
    return " ".join(parts)


@dataclass(frozen=True)
class Deadline:
    """An invocation's time budget: `seconds` given, spent once `clock()` reaches `end` (a reading of the clock).
    Frozen and plain, so that worker processes receive it as it is."""

    seconds: float
    end: float

    @classmethod
    def start(cls, seconds: float) -> Deadline:
        """A budget of `seconds` from now."""
        return cls(seconds, clock() + seconds)

    def spent(self) -> bool:
        """Whether the budget is spent: no new run may start (one look at the clock)."""
        return clock() >= self.end

    @property
    def text(self) -> str:
        return format_duration(self.seconds)
