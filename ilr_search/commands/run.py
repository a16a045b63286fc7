"""`ilr-search run`: the search use case under the CLI. It reads the request's space, checks every input before
anything is opened (the same check `--dry-run` makes), chooses how the run uses the machine (fused groups, worker
processes, threads), and runs the study: its trials, reference runs and race.

How the run uses a CPU, as measured on this project's 2-core machine (benchmarks/reports/, the default run):
- the trials and reference runs train in one process on every core (fused groups of the space's K): 127 s for the
  default run's, against 154 s in two one-thread worker processes;
- the race trains in one one-thread worker process a core (commands/workers.race_in_workers), which share every
  wave of it;
- on a machine already busy when the run starts (a load average of BUSY_LOAD or more), every process trains on one
  thread: a two-thread process collapses there (150 steps of a 1.24x map: 5.3 s quiet, 36.5 s with both cores
  busy, against 11.4 s for one thread).
`--workers N` runs N worker processes for everything instead.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ilr_search.commands.autofuse import parse_fuse, run_layout
from ilr_search.errors import UserInputError
from ilr_search.search.maps import split_enqueue_text
from ilr_search.search.plan import ADOPTED_RACE_FIELDS
from ilr_search.search.progress import Event, Message, RunReporter, StudyStarted
from ilr_search.search.run import RunRequest
from ilr_search.search.studies import StudyReport
from ilr_search.config import SpaceConfig
from ilr_search.space import load_space, parse_target
from ilr_search.training.device import resolve_device

@dataclass(frozen=True)
class RunOptions:
    """What `run` was asked beyond the space: the flags, as given (None: not given)."""
    space: str | Path | None = None
    overrides: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    budget: str = "1.5x"
    study: str | None = None
    storage: str | None = None
    n_trials: int | None = None
    timeout: float | None = None
    sampler: str | None = None
    pruner: str | None = None
    objective: str | None = None
    workers: int | None = None
    fuse: str | None = None
    knobs: str | None = None
    target: str | None = None
    race_seeds: int | None = None
    max_seeds: int | None = None
    max_race_steps: int | None = None
    race_policy: str | None = None
    equal_compute: str | None = None
    enqueue: str | None = None


def run_request(options: RunOptions) -> tuple[RunRequest, int | str]:
    """The study `options` ask for, and the fused group size asked for (a number or "auto"); bad input raises a
    UserInputError before anything is opened."""
    searched = None if options.knobs is None else [k.strip() for k in options.knobs.split(",") if k.strip()]
    race = {"race_policy": options.race_policy, "max_seeds": options.max_seeds, "equal_compute": options.equal_compute}
    search = {"objective": options.objective, "knobs": searched,
              "target": None if options.target is None else parse_target(options.target),
              "race_seeds": options.race_seeds, "max_race_steps": options.max_race_steps,
              "enqueue": None if options.enqueue is None else split_enqueue_text(options.enqueue)} | race
    if options.workers is not None and options.workers < 1:
        raise UserInputError(f"--workers must be at least 1, got {options.workers}")
    asked_fuse = None if options.fuse is None else parse_fuse(options.fuse)
    overrides = {**options.overrides, "search": {**options.overrides.get("search", {}), **search}}
    space = load_space(options.space, overrides)
    request = RunRequest(space, options.budget, options.study, options.storage, n_trials=options.n_trials,
                         timeout=options.timeout, sampler=options.sampler, pruner=options.pruner,
                         asked_race=tuple((k, v) for k, v in race.items() if v is not None and k in ADOPTED_RACE_FIELDS))
    return request, asked_fuse if asked_fuse is not None else space.search.fuse


BUSY_LOAD = 0.75  # the 1-minute load average at which a run starts its processes on one thread


def race_processes(space: SpaceConfig, groups: int) -> int:
    """Race worker processes for a run of `groups` worker processes: one a core on a CPU with several cores when
    the run is one process (a multi-process run races in its workers already); 1 (in the run's own process)
    otherwise."""
    cores = os.cpu_count() or 1
    if groups != 1 or cores < 2 or resolve_device(space.train.device).type != "cpu":
        return 1
    return cores


def busy_machine(space: SpaceConfig) -> float | None:
    """The load average when another program keeps this CPU busy (None when it is not, or on a GPU)."""
    if resolve_device(space.train.device).type != "cpu":
        return None
    load = os.getloadavg()[0]
    return load if load >= BUSY_LOAD else None


class NoteAtStart(RunReporter):
    """A reporter that says `note` once the study has started (after the run's input checks, so that bad input
    still gets its one error line alone)."""

    def __init__(self, inner: RunReporter, note: str | None) -> None:
        self.inner, self.note = inner, note

    def on(self, event: Event) -> None:
        self.inner.on(event)
        if self.note and isinstance(event, StudyStarted):
            self.inner.on(Message(self.note))
            self.note = None


def run_search(request: RunRequest, fuse: int | str, workers: int | None,
               reporter_for: Callable[[], AbstractContextManager[RunReporter]],
               note: Callable[[str], None] = lambda text: None) -> StudyReport:
    """Run (or resume) the study: the layout from `fuse` and `workers` (checked against memory, or probed for
    auto: `note` is told what was chosen), then the trials, references and race in this process or in workers.
    `reporter_for` gives the reporter that shows the run's events."""
    choice = run_layout(request, fuse, workers)
    if choice.reason:
        note(choice.reason)
    layout = choice.layout
    request = dataclasses.replace(request, fuse=layout.fuse)
    if layout.groups != 1:
        from ilr_search.commands.workers import run_workers

        with reporter_for() as reporter:
            return run_workers(request, layout.groups, reporter, threads=layout.threads)
    from ilr_search.search.run import run_study

    threads = layout.threads
    load = busy_machine(request.space) if threads is None else None
    busy = None
    if load is not None:
        threads = 1
        busy = f"the machine is busy (load average {load:.2f} on {os.cpu_count()} cores): training on one thread a process"
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    racers = race_processes(request.space, layout.groups)
    runner = None
    if racers > 1:
        from ilr_search.commands.workers import race_in_workers

        runner = race_in_workers(request, racers, threads=1)
    with reporter_for() as reporter:
        return run_study(request, NoteAtStart(reporter, busy), race_runner=runner)
