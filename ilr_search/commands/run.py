"""`ilr-search run`: the search use case under the CLI. It reads the request's space, checks every input before
anything is opened (the same check `--dry-run` makes), chooses how the run uses the machine (fused groups, worker
processes, threads), and runs the study: its trials, reference runs and race.

How the run uses the machine (its layout: commands/layout.py) is chosen from the cores the run may use, never from
the machine's load: threads and fusion change the float rounding of training, so a layout read from a lagging load
average would give another study from the same command. On a CPU of C usable cores:
- the trials and reference runs train in one process of C threads (fused groups of the space's K; faster than C
  one-thread worker processes: benchmarks/reports/default-run_cpu-2core_2026-12-02.md);
- the race trains in C one-thread worker processes (commands/workers.race_in_workers), which share every wave of it.
`--workers N` runs N worker processes for everything instead. The layout is stored with the study, and a resume
reuses it unless `--fuse` or `--workers` asks for another (then one line says that results may differ in their
rounding from the earlier part of the study). Other programs on the machine slow the run, but change none of its
numbers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from ilr_search.commands.api import with_init
from ilr_search.commands.autofuse import Layout, parse_fuse
from ilr_search.commands.layout import process_threads, race_processes, usable_cores
from ilr_search.config import SpaceConfig
from ilr_search.errors import UserInputError
from ilr_search.options import RunOptions, check_init_flags
from ilr_search.search.maps import split_enqueue_text
from ilr_search.search.phases import PhaseMeter
from ilr_search.search.plan import PhaseLayout, StudyLayout
from ilr_search.search.progress import Event, Message, RunReporter, StudyStarted
from ilr_search.search.run import RunRequest
from ilr_search.search.studies import StudyReport
from ilr_search.space import load_space, parse_target
from ilr_search.time_budget import parse_duration


def run_request(options: RunOptions) -> RunRequest:
    """The study `options` ask for; bad input raises a UserInputError before anything is opened."""
    check_init_flags(options.given(), options.init)
    searched = None if options.knobs is None else [k.strip() for k in options.knobs.split(",") if k.strip()]
    objective, task = parse_objective(options.objective)
    given = options.overrides()
    search = {
        "objective": objective,
        "knobs": searched,
        "parts": None if options.parts is None else [p.strip() for p in options.parts.split(",") if p.strip()],
        "target": None if options.target is None else parse_target(options.target),
        "race_seeds": options.race_seeds,
        "max_race_steps": options.max_race_steps,
        "enqueue": None if options.enqueue is None else split_enqueue_text(options.enqueue),
        "time_budget": None if options.time_budget is None else parse_duration(options.time_budget),
    }
    overrides = {**given, "search": {**given.get("search", {}), **search}}
    if task is not None:
        overrides["data"] = {**given.get("data", {}), "task": task}
    if options.train_steps is not None:
        if options.steps is not None and options.steps != options.train_steps:
            raise UserInputError(f"--steps {options.steps} and --train-steps {options.train_steps} disagree; give one")
        if options.train_steps < 0:
            raise UserInputError(
                f"--train-steps must be 0 (frozen: evaluate only) or a positive number of steps, "
                f"got {options.train_steps}"
            )
        overrides["train"] = {**given.get("train", {}), "steps": options.train_steps}
    return RunRequest(
        with_init(load_space(options.space, overrides), options.init),
        options.budget,
        options.study,
        options.storage,
        n_trials=options.n_trials,
        timeout=options.timeout,
        sampler=options.sampler,
        pruner=options.pruner,
        fuse=None if options.fuse is None else parse_fuse(options.fuse),
        workers=options.workers,
        asked_race=options.asked_race,
        learn=options.learn,
    )


def parse_objective(text: str | None) -> tuple[str | None, str | None]:
    """`--objective` as (objective, lm-eval task): `lm-eval:TASK` names its task; the others none."""
    if text is None or not text.startswith("lm-eval"):
        return text, None
    objective, _, task = text.partition(":")
    if objective != "lm-eval" or not task.strip():
        raise UserInputError(f"--objective {text!r}: an lm-eval task is written lm-eval:TASK, e.g. lm-eval:arc_easy")
    return objective, task.strip()


@dataclass(frozen=True)
class LayoutChoice:
    """The layout a run uses; `reason`: what --fuse auto's probe chose (said at once); `line`: the layout and where it
    came from (said once the study has started)."""

    layout: StudyLayout
    reason: str = ""
    line: str = ""


def machine_layout(choice: Layout, space: SpaceConfig) -> StudyLayout:
    """The study's layout from the trials' (groups, K, threads, lanes): several groups race in their own processes;
    one process on a CPU of several cores races in one one-thread worker process a core; else the race trains in
    the run's own process."""
    threads = choice.threads if choice.threads is not None else process_threads(space, choice.groups)
    trials = PhaseLayout(choice.groups, threads, choice.fuse, choice.lanes)
    racers = race_processes(space, choice.groups)
    race = PhaseLayout(racers, 1, choice.fuse) if racers > 1 else trials
    return StudyLayout(trials, race)


def stored_study_layout(request: RunRequest, name: str) -> StudyLayout | None:
    """The layout the study `name` last ran with, where the storage has that study (nothing is created)."""
    from ilr_search.search.plan import stored_layout, stored_study
    from ilr_search.storage import open_storage, parse_storage

    spec = parse_storage(request.storage)
    if not spec.exists():
        return None
    study = stored_study(open_storage(spec), name)
    return None if study is None else stored_layout(study.user_attrs)


def choose_layout(request: RunRequest) -> LayoutChoice:
    """The run's layout: a resumed study's stored one unless the request asks for a fused group size or workers;
    else from those (checked against memory, or probed for auto; the space's fuse where not asked, 1 for a
    pretrained model) and the usable cores. Bad input raises first (search/run.checked_request)."""
    from ilr_search.commands.autofuse import check_memory, resolve_layout
    from ilr_search.search.run import checked_request

    _, _, plan = checked_request(request)
    stored = stored_study_layout(request, plan.name)
    if stored is not None and request.fuse is None and request.workers is None:
        check_memory(plan, stored.trials.processes, stored.trials.fuse)
        return LayoutChoice(stored, line=f"layout: {stored.describe()} (the study's stored layout)")
    choice = resolve_layout(plan, request.asked_fuse, request.workers, request.trials_wanted)
    layout = machine_layout(choice.layout, plan.space)
    if stored is not None and layout != stored:
        line = (
            f"layout: {layout.describe()}, not the study's stored {stored.describe()} (--fuse or --workers asked "
            "for it): results may differ in their rounding from the earlier part of the study"
        )
    else:
        line = f"layout: {layout.describe()} (from {usable_cores()} usable cores)"
    return LayoutChoice(layout, choice.reason, line)


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


def run_study(
    request: RunRequest,
    reporter: RunReporter | None = None,
    *,
    shown_by: Callable[[], AbstractContextManager[RunReporter]] | None = None,
    note: Callable[[str], None] = lambda text: None,
) -> StudyReport:
    """Run (or resume) the study `request` asks for, as `ilr-search run` does (the CLI calls this, so the Python
    API gives the CLI's study): the layout (choose_layout; `note` is told how --fuse auto chose it), stored with the
    study, then the trials, reference runs and race in this process or in workers. `reporter` is told the run's
    events; `shown_by` instead gives a reporter to enter once the layout is chosen (the CLI's console). The report
    carries the layout and the phases (wall time, tokens and CPU time of each)."""
    request = request.started()  # the time budget counts from here: the layout's probe and the tokens too
    choice = choose_layout(request)
    if choice.reason:
        note(choice.reason)
    layout = choice.layout
    request = dataclasses.replace(request, layout=layout)
    with (shown_by or (lambda: nullcontext(reporter or RunReporter())))() as shown:
        meter = PhaseMeter(NoteAtStart(shown, choice.line), request.space)
        if layout.trials.processes != 1:
            from ilr_search.commands.workers import run_workers

            summary = run_workers(request, layout.trials.processes, meter, threads=layout.trials.threads)
        else:
            from ilr_search.search.run import run_in_process

            if layout.trials.threads is not None:
                import torch

                torch.set_num_threads(layout.trials.threads)
            runner = None
            if layout.race.processes > 1:
                from ilr_search.commands.workers import race_in_workers

                runner = race_in_workers(request, layout.race.processes, threads=layout.race.threads or 1)
            summary = run_in_process(request, meter, race_runner=runner)
    return dataclasses.replace(summary, layout=layout, phases=tuple(meter.finish()))
