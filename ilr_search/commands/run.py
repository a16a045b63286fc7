"""`ilr-search run`: the search use case under the CLI. It reads the request's space, checks every input before
anything is opened (the same check `--dry-run` makes), chooses how the run uses the machine (fused groups, worker
processes, threads), and runs the study: its trials, reference runs and race.

The default space runs one worker process a CPU core, one thread each (`workers = "cores"`): at the default size
two one-thread proxies at once train about twice as fast as one two-thread proxy, and a two-thread process on a
busy machine can collapse many times over. The workers share the trials, the reference runs and every wave of the
race (commands/workers.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ilr_search.commands.autofuse import parse_fuse, run_layout
from ilr_search.errors import UserInputError
from ilr_search.search.maps import split_enqueue_text
from ilr_search.search.plan import ADOPTED_RACE_FIELDS
from ilr_search.search.run import RunRequest
from ilr_search.space import load_space, parse_target

Reporter = Any  # a RunReporter (one process) or a worker-event reporter (worker processes)


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


def run_search(request: RunRequest, fuse: int | str, workers: int | None,
               one_process: Callable[[], AbstractContextManager[Reporter]],
               worker_processes: Callable[[], AbstractContextManager[Reporter]],
               note: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
    """Run (or resume) the study: the layout from `fuse` and `workers` (checked against memory, or probed for
    auto: `note` is told what was chosen), then the trials, references and race in this process or in workers.
    `one_process` and `worker_processes` give the reporter to show progress with."""
    choice = run_layout(request, fuse, workers)
    if choice.reason:
        note(choice.reason)
    layout = choice.layout
    request = dataclasses.replace(request, fuse=layout.fuse)
    if layout.groups != 1:
        from ilr_search.commands.workers import run_workers

        with worker_processes() as reporter:
            return run_workers(request, layout.groups, reporter, threads=layout.threads)
    from ilr_search.search.run import run_study

    if layout.threads is not None:
        import torch

        torch.set_num_threads(layout.threads)
    with one_process() as reporter:
        return run_study(request, reporter)
