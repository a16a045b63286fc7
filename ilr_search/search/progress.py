"""What a run tells its caller: one stream of events.

A run calls `reporter.on(event)` for each thing that happens. The CLI's renderer draws bars and lines from them
(cli/live.py), a worker process sends each one to its parent, which hands it to its own reporter (commands/workers.py),
and tracking logs the finished trials (commands/tracking.py). `worker` is the number of the worker process an event
comes from, None in the run's own process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ilr_search.analysis.replicates import Replicates

if TYPE_CHECKING:  # the CLI draws these events without importing optuna
    from ilr_search.analysis.results import FrontRow
    from ilr_search.storage.trials import TrialRecord

# Which command trains a race run: the study's race (`run`), or `audit`; the progress lines name it ("audit run: ...").
RunKind = Literal["race", "audit"]


@dataclass(frozen=True)
class StudyStarted:
    """A study's run begins: `words` says what its replicates are (seeds, or a frozen study's chunks of windows
    or items), what it judges and how it writes its maps (analysis/replicates.py)."""

    study: str
    n_trials: int  # finished trials the study goes to
    finished: int
    worker: int | None = None
    words: Replicates = Replicates()


@dataclass(frozen=True)
class TrialStarted:
    number: int
    reuse_map: list[int]
    steps: int
    knobs: str = ""
    worker: int | None = None
    map: str = ""  # the map as a study writes it (a block map's block:I-J:R); "": the reuse map's counts


@dataclass(frozen=True)
class Step:
    """A training step of the run in progress (of a fused group: of its first member)."""

    step: int
    steps: int
    loss: float
    worker: int | None = None


@dataclass(frozen=True)
class TrialFinished:
    trial: TrialRecord
    front: list[FrontRow]  # the study's front after it
    finished: int  # trials finished in the study
    worker: int | None = None


@dataclass(frozen=True)
class ReferenceStarted:
    """Reference run `index` (0-based) of the `count` this worker trains after the trials."""

    name: str
    index: int
    count: int
    steps: int
    worker: int | None = None


@dataclass(frozen=True)
class ReferenceFinished:
    name: str
    worker: int | None = None


@dataclass(frozen=True)
class RunsStarted:
    """Runs of the race (or of `audit`) beyond the trials, trained together: one, or a fused group; each
    (map key, steps, seed)."""

    runs: tuple[tuple[str, int, int], ...]
    kind: RunKind = "race"
    worker: int | None = None


@dataclass(frozen=True)
class RunFinished:
    """One race or audit run stored: its result (val_ppl None where it diverged); a frozen run's `tokens` evaluated."""

    map_key: str
    steps: int
    seed: int
    val_ppl: float | None
    kind: RunKind = "race"
    worker: int | None = None
    tokens: int = 0


@dataclass(frozen=True)
class Message:
    text: str
    worker: int | None = None


Event = (
    StudyStarted
    | TrialStarted
    | Step
    | TrialFinished
    | ReferenceStarted
    | ReferenceFinished
    | RunsStarted
    | RunFinished
    | Message
)


class RunReporter:
    """Receives a run's events; this one ignores them (a run with nobody watching)."""

    def on(self, event: Event) -> None:
        pass


def step_callback(reporter: RunReporter) -> Callable[[int, int, float], None]:
    """The trainer's on_step (step, steps, loss) as Step events."""
    return lambda step, steps, loss: reporter.on(Step(step, steps, loss))
