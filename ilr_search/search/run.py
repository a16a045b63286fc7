"""Running a study: prepare it (check input, tokenize, create or load, enqueue), run workers' trials until the study
has its n_trials, train the reference runs, and report; a full disk ends the run with one error line."""

from __future__ import annotations

import dataclasses
import errno
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import optuna
import sqlalchemy as sa
from optuna.trial import FrozenTrial, TrialState

from ilr_search.analysis.answer import out_of_time_answer
from ilr_search.analysis.fidelity import best_recurrent
from ilr_search.analysis.results import FrontRow, as_list, finite_or_none, study_front
from ilr_search.config import SIZE_MAXIMA, WORKERS_MAX, SpaceConfig, StudySettings, scored_by_item
from ilr_search.errors import StorageFullError, UserInputError
from ilr_search.folders import check_can_create
from ilr_search.knobs import KnobValue, config_key
from ilr_search.search.learn import LEARNED_ATTR, check_learnable, learned_line, learned_schedule
from ilr_search.search.maps import EnqueuedMap, first_params, knobs_off, parse_enqueued
from ilr_search.search.plan import (
    CONFIG_ATTR,
    ENQUEUED_BLOCKS_ATTR,
    SAMPLER_ATTR,
    StudyLayout,
    StudyPlan,
    adopt_stored,
    canonical_config,
    check_resume,
    plan_study,
    record_layout,
    safe_name,
    stored_study,
)
from ilr_search.search.progress import (
    Message,
    ReferenceFinished,
    ReferenceStarted,
    RunReporter,
    StudyStarted,
    TrialFinished,
    step_callback,
)
from ilr_search.search.pruners import build_pruner, pruner_settings
from ilr_search.search.race import MayStart, RaceRunner, race_checkpoints, run_race
from ilr_search.search.race_results import race_settings
from ilr_search.search.samplers import build_sampler, sampler_settings
from ilr_search.search.studies import StudyReport, study_report
from ilr_search.search.trial_groups import SearchRun, TrialTakenOver, sweep_stale_trials
from ilr_search.space import check_search_objective, validate_space
from ilr_search.storage import (
    JournalStore,
    StorageSpec,
    Store,
    heartbeat_interval,
    new_worker,
    open_storage,
    open_store,
    parse_storage,
    reference_run,
    stored_references,
    study_storage,
)
from ilr_search.storage.trials import TrialRecord, study_trials, told_trials, trial_record
from ilr_search.time_budget import Deadline, parse_duration
from ilr_search.training.flops import flops_ratio
from ilr_search.training.frozen import EvalData, eval_chunks, load_space_data
from ilr_search.training.jobs import Job, groups, train_jobs
from ilr_search.training.schedule import Map, block_schedule, format_reuse_map


@dataclass(frozen=True)
class RunRequest:
    """The study a run asks for, and how to run it: what `run` (the CLI and the Python API, both through
    commands/run.run_study), its worker processes and `run --dry-run` share. Settings left None take the space's
    (and on resume the study's)."""

    space: SpaceConfig
    budget: str  # forward compute per token: "1.5x", "150%" of the plain model's, or FLOPs like "4.2e6"
    study_name: str | None = None  # None: derived from the configuration (plan.derive_study_name)
    storage: str | None = None  # an Optuna storage URL or journal:PATH; None: sqlite:///studies/ilr-search.db
    n_trials: int | None = None  # finished trials the study reaches in total; None: the space's n_trials
    timeout: float | None = None  # seconds after which no new trial starts
    sampler: str | None = None  # overrides the space's; must match a resumed study's
    pruner: str | None = None  # likewise
    enqueue_maps: tuple[tuple[int, ...], ...] = ()  # tried first after the baseline (over-budget maps repaired)
    checkpoint_dir: str | Path | None = None  # trial checkpoints go under it; None: studies/checkpoints
    race: bool = True  # race the contenders after the trials (False: not, e.g. a benchmark table)
    # Maps trained at once in one fused group (search/trial_groups.py), a number or "auto" (a short probe chooses),
    # and worker processes; None: a resumed study's stored layout, else the space's fuse (1 for a pretrained
    # model) in one process. Asking for either on a resume changes the layout (commands/run.choose_layout).
    fuse: int | Literal["auto"] | None = None
    workers: int | None = None
    # The race settings this request asks for ({field: value}: race_policy, max_seeds, equal_compute, the ones
    # given), which a resumed study keeps as it was made (plan.ADOPTED_RACE_FIELDS); one not given takes the
    # space's, or on resume the study's. One that differs from a resumed study's is refused.
    asked_race: Mapping[str, str | int] = dataclasses.field(default_factory=dict)
    # How the run uses the machine (processes, threads, fused group size), chosen by commands/run.run_study from
    # fuse and workers and stored with the study; None (the engine run directly): one process, `fuse` maps at once
    layout: StudyLayout | None = None
    # The invocation's time budget under way (started from the space's time_budget: `started`), handed to its worker
    # processes as it is; None: no budget, or not started yet
    deadline: Deadline | None = None
    # `run --learn`: a map learned by one gated model at the widest schedule, enqueued as a trial (search/learn.py)
    learn: bool = False

    @property
    def time_budget(self) -> float | None:
        """The invocation's wall-clock budget in seconds (`run --time-budget`, `[search] time_budget`); None: none."""
        given = self.space.search.time_budget
        return None if given is None else parse_duration(given, "time_budget")

    def started(self) -> RunRequest:
        """The request with its time budget counting from now (as it is where it has none, or one under way)."""
        seconds = self.time_budget
        if seconds is None or self.deadline is not None:
            return self
        return dataclasses.replace(self, deadline=Deadline.start(seconds))

    def check(self) -> None:
        """Bad numbers raise a UserInputError, before anything is opened."""
        fewest = 0 if self.learn else 1  # --learn --n-trials 0: the learned map and the plain model alone
        if self.n_trials is not None and not fewest <= self.n_trials <= SIZE_MAXIMA["search", "n_trials"]:
            raise UserInputError(
                f"--n-trials must be a positive number of trials (0 with --learn: the learned map alone), at most "
                f"{SIZE_MAXIMA['search', 'n_trials']:,}, got {self.n_trials}"
            )
        if self.timeout is not None and self.timeout <= 0:
            raise UserInputError(f"--timeout must be a positive number of seconds, got {self.timeout}")
        if self.fuse is not None and self.fuse != "auto":
            check_fuse(self.fuse)
        if self.workers is not None and not 1 <= self.workers <= WORKERS_MAX:
            raise UserInputError(f"--workers must be 1 to {WORKERS_MAX:,}, got {self.workers}")
        if self.space.model.init and self.fuse not in (None, 1, "auto"):
            raise UserInputError(
                f"--fuse {self.fuse}: the fused trainer cannot train a pretrained model (--init); "
                "its maps train one at a time (--fuse 1)"
            )

    @property
    def asked_fuse(self) -> int | Literal["auto"]:
        """The fused group size a new layout is chosen from: `fuse`, else the space's; 1 for a pretrained model,
        since the fused trainer stacks the project's own model."""
        if self.space.model.init:
            return 1
        return self.fuse if self.fuse is not None else self.space.search.fuse

    @property
    def trials_fuse(self) -> int:
        """The fused group size the trials train at: the chosen layout's, else `fuse` where a number, else 1."""
        if self.layout is not None:
            return self.layout.trials.fuse
        return self.fuse if isinstance(self.fuse, int) else 1

    @property
    def checkpoints(self) -> Path:
        """The folder of the run's checkpoints (a study's trials and race runs under its own subfolder)."""
        return Path(self.checkpoint_dir or "studies/checkpoints")

    @property
    def trials_wanted(self) -> int:
        """The finished trials asked for: n_trials, or the space's."""
        return self.n_trials if self.n_trials is not None else self.space.search.n_trials


def run_in_process(
    request: RunRequest,
    reporter: RunReporter | None = None,
    reference_share: tuple[int, int] = (0, 1),
    race_runner: RaceRunner | None = None,
) -> StudyReport:
    """The study's engine in this process, under commands/run.run_study (which chooses the layout) and each worker
    process: run (or resume) the study `request` asks for until it has its finished trials, then race its
    contenders at more seeds and up to the race's target length (race.py; unless request.race is False); returns
    the study's report (StudyReport). With `reference_share` (k, n), worker k of n trains its share of the
    reference runs. `race_runner`: what trains the race, run_race's signature (run_race in this process where None;
    commands/workers spreads it over worker processes).

    A full disk ends the run with a StorageFullError; finished trials stay in the storage.
    """
    with disk_full_is_reported():
        return _run_in_process(request, reporter or RunReporter(), reference_share, race_runner)


@dataclass
class PreparedStudy:
    """A study checked, created (or loaded) with its settings and first maps, and its tokens at hand."""

    space: SpaceConfig
    spec: StorageSpec
    plan: StudyPlan
    study: optuna.Study
    settings: StudySettings
    data: EvalData
    n_trials: int = 0  # finished trials to reach: --n-trials, or more where the enqueued maps need them
    n_trials_raised_from: int | None = None  # --n-trials, where the enqueued maps raised it


def checked_request(request: RunRequest) -> tuple[StorageSpec, SpaceConfig, StudyPlan]:
    """The input checks of a run that need nothing opened, in one order: the storage URL, the numbers, the space,
    the budget and the maps asked for (planned_space). `run` (its layout, then its study) and `run --dry-run`
    start here, so they refuse the same input with the same line."""
    spec = parse_storage(request.storage)
    request.check()
    space, plan = planned_space(request)
    if space.train.checkpoint_every or request.race:  # the race's runs always checkpoint
        check_can_create(
            request.checkpoints, f"checkpoints in {str(request.checkpoints)!r}", "run in a writable folder"
        )
    return spec, space, plan


@dataclass(frozen=True)
class OpenedStudy:
    """A request's study opened for resuming, nothing created: its checked input (checked_request), its storage
    (None where there is none yet), its plan with what the stored study fixes adopted (the dtype under
    `--dtype auto`, the race settings), the stored study (None: a new study) and its stored sampler and pruner
    settings (None: new, or stored without them), and its told trials. `run` (prepare_study) and `run --dry-run`
    start here."""

    spec: StorageSpec
    space: SpaceConfig
    plan: StudyPlan
    storage: optuna.storages.BaseStorage | None
    study: optuna.Study | None
    settings: StudySettings | None
    trials: list[TrialRecord]  # told_trials: [] for a new study


def open_request(request: RunRequest) -> OpenedStudy:
    """The study `request` asks for, opened for resuming (OpenedStudy): the input checked, the stored study loaded
    once, its dtype and race adopted, and a resume with other settings refused (check_resume). Nothing is
    written."""
    spec, space, plan = checked_request(request)
    storage = open_storage(spec) if spec.exists() else None  # the one storage handle of this process
    study = stored_study(storage, plan.name)
    plan = adopt_stored(study, plan, space.train.dtype == "auto", request.asked_race)
    settings = check_resume(study, spec, plan, request.pruner)
    trials = told_trials(study) if study is not None else []
    return OpenedStudy(spec, space, plan, storage, study, settings, trials)


def planned_space(request: RunRequest) -> tuple[SpaceConfig, StudyPlan]:
    """The space with the request's sampler and pruner, checked, and the study it makes, its maps asked for
    checked too (nothing is opened)."""
    # the flags given, as typed (validate_space checks their values in the space they make)
    chosen: dict[str, Any] = {k: v for k, v in (("sampler", request.sampler), ("pruner", request.pruner)) if v}
    search = dataclasses.replace(request.space.search, **{**chosen, **request.asked_race})
    space = evaluation_only_space(dataclasses.replace(request.space, search=search), request)
    validate_space(space)
    check_search_objective(space)
    if request.learn:
        check_learnable(space)
    plan = plan_study(space, request.budget, request.study_name)
    enqueued_maps(plan, enqueue_texts(request, space))
    return space, plan


def evaluation_only_space(space: SpaceConfig, request: RunRequest) -> SpaceConfig:
    """A frozen study's space (train.steps 0: each map applied to the pretrained weights and only evaluated, a seed
    being a chunk of held-out windows or items): no pruning, since a trial is one evaluation and there is no early
    perplexity to stop at, no equal-compute reference, since a deeper plain model of the checkpoint does not
    exist, and no reference runs. A flag that asks for either is refused; other spaces are returned as they are."""
    if space.train.steps != 0:
        return space
    if not space.model.init:
        raise UserInputError(
            "--train-steps 0 (a frozen search: maps only evaluated) needs a pretrained model: add "
            "--init PATH or hf:NAME"
        )
    if request.pruner not in (None, "none"):
        raise UserInputError(
            f"--pruner {request.pruner} cannot prune a frozen search (--train-steps 0): each trial "
            "is one evaluation, with no early perplexity to prune on; drop --pruner"
        )
    if request.asked_race.get("equal_compute") == "depth":
        raise UserInputError(
            "--equal-compute depth needs training: a frozen search (--train-steps 0) has no deeper "
            "plain model of the checkpoint to compare with; drop --equal-compute"
        )
    # no reference runs either: the race scores the plain model on every chunk it tests on, paired
    search = dataclasses.replace(space.search, pruner="none", equal_compute="off", noise_seeds=0)
    return dataclasses.replace(space, search=search)


def check_window_chunks(space: SpaceConfig, data: EvalData) -> None:
    """A frozen study evaluates window chunk s for seed s: the trials chunk train.seed, the reference runs and the
    race the chunks after it, up to the race's pool of max_seeds; refused up front where the validation split
    holds fewer."""
    t, s = space.train, space.search
    needed = t.seed + max(s.max_seeds, s.race_seeds, s.noise_seeds + 1)
    have = eval_chunks(data, t.eval_windows, space.model.seq_len)
    if have < needed:
        source = f"lm-eval task {space.data.task}" if space.search.objective == "lm-eval" else space.data.corpus
        what = (
            f"items, and {source} holds {have}; use more items"
            if scored_by_item(space.search.objective, t.steps)
            else f"held-out windows of {space.model.seq_len + 1} tokens, and the validation split holds {have}; "
            "use more text, a larger val_fraction"
        )
        raise UserInputError(
            f"a frozen search evaluates up to {needed} chunks of {t.eval_windows} disjoint {what}, fewer "
            "eval_windows or a smaller --max-seeds"
        )


def enqueue_texts(request: RunRequest, space: SpaceConfig) -> list[str]:
    """The maps a run asks to have trained first, as written: the space's enqueue list (`run --enqueue`), then
    the request's own maps (the Python API's)."""
    return list(space.search.enqueue) + [format_reuse_map(list(m)) for m in request.enqueue_maps]


def enqueued_maps(plan: StudyPlan, enqueue: list[str]) -> list[EnqueuedMap]:
    """Each map asked for, parsed against the study's layers, max_reuse, budget and searched knobs; a bad one
    raises a UserInputError."""
    search = plan.space.search
    max_runs = plan.budget.max_layer_runs(plan.model)
    return [
        parse_enqueued(
            text,
            plan.model.n_layers,
            search.max_reuse,
            max_runs,
            search.knobs,
            search.families,
            search.parts,
            plan.budget.pass_costs(plan.model),
            lambda knobs: plan.budget.pass_costs(plan.trial_model(dict(knobs))),
        )
        for text in enqueue
    ]


def prepare_study(request: RunRequest) -> PreparedStudy:
    """Everything `run` does before its first trial: check the input (nothing on disk changes when it is bad),
    tokenize (cached), create or load the study, store its settings and enqueue the first maps. Workers
    started after it find all of this in place."""
    opened = open_request(request)
    spec, space, plan, stored = opened.spec, opened.space, opened.plan, opened.study
    if stored is None:
        check_no_orphan_records(spec, plan.name, opened.storage)
    data = load_space_data(space)
    if space.train.steps == 0:
        check_window_chunks(space, data)
    learned = learned_schedule(plan, data, stored.user_attrs if stored else {}) if request.learn else None
    enqueue = enqueue_texts(request, space) + ([learned["map"]] if learned else [])
    first = first_trials(opened, request.trials_wanted, enqueue)
    directions: list[Literal["minimize"]] = (
        ["minimize"] if space.search.objective == "ppl" else ["minimize", "minimize"]
    )
    settings = opened.settings or StudySettings(
        sampler_settings(space.search.sampler, space.train.seed, space.search.max_reuse), pruner_settings(space)
    )
    pruning = settings.pruner
    optuna_sampler = optuna.samplers.RandomSampler()
    optuna_pruner = (
        optuna.pruners.MedianPruner(n_startup_trials=pruning.warmup, n_warmup_steps=0)
        if pruning.name == "median"
        else optuna.pruners.NopPruner()
    )
    storage_obj = opened.storage or open_storage(spec)
    if stored is None:
        study = optuna.create_study(
            study_name=plan.name,
            storage=storage_obj,
            directions=directions,
            sampler=optuna_sampler,
            pruner=optuna_pruner,
            load_if_exists=True,  # another worker may have made it since
        )
    else:  # the stored study, with the sampler and pruner a new one is made with
        study = stored
        study.sampler, study.pruner = optuna_sampler, optuna_pruner
    if SAMPLER_ATTR not in study.user_attrs:  # first: a worker that sees the configuration sees these too
        study.set_user_attr(SAMPLER_ATTR, settings.to_dict())
    if learned is not None and LEARNED_ATTR not in study.user_attrs:
        study.set_user_attr(LEARNED_ATTR, learned)
    if CONFIG_ATTR not in study.user_attrs:
        study.set_user_attr(CONFIG_ATTR, canonical_config(plan.config))
        study.set_metric_names(["val_ppl"] if len(directions) == 1 else ["val_ppl", "flops_ratio"])
    settings = StudySettings.from_dict(study.user_attrs[SAMPLER_ATTR])
    if request.layout is not None:
        record_layout(study, request.layout, n_finished(told_trials(study)))

    if first.blocks:  # block K asked for: trained with the reference runs (one list, however many resumes)
        blocks = sorted(set(study.user_attrs.get(ENQUEUED_BLOCKS_ATTR, [])) | set(first.blocks))
        study.set_user_attr(ENQUEUED_BLOCKS_ATTR, blocks)
    for params in first.params:
        study.enqueue_trial(params, skip_if_exists=True)
    # the project's tables too, before any worker races to create them; killed workers' trials: failed and queued again
    sweep_stale_trials(study, open_store(spec, plan.name, storage=storage_obj))
    asked = request.trials_wanted
    raised = first.n_trials > asked and not (request.learn and asked == 0)
    return PreparedStudy(space, spec, plan, study, settings, data, first.n_trials, asked if raised else None)


def check_no_orphan_records(spec: StorageSpec, name: str, storage: optuna.storages.BaseStorage | None) -> None:
    """A new study finds no ilr-search records under its name: claims, curves or race runs left by an earlier study
    of that name whose Optuna side is gone (a deleted journal beside a kept side file, a deleted study) would be
    taken for its own, and a stale claim would make it wait for a trial that never trains that map."""
    if spec.kind != "journal" and storage is None:
        return  # no database yet
    store = open_store(spec, name, read_only=True, storage=storage)
    if not store.holds_records():
        return
    if isinstance(store, JournalStore):
        raise UserInputError(
            f"{store.path} holds records of an earlier study named {name!r}, but the journal "
            f"{spec.path} does not have that study (was it deleted?); delete {store.path} "
            f"to start afresh, or name another --study"
        )
    raise UserInputError(
        f"the database holds ilr-search records of a study named {name!r} that Optuna no longer "
        f"has (was it deleted?); name another --study"
    )


@dataclass(frozen=True)
class FirstTrials:
    """What a run enqueues before the sampler's first proposal: trial parameters in order, block K
    references asked for, and the finished trials the run goes to (raised where the maps asked for need it)."""

    params: list[dict[str, Any]]
    blocks: list[int]
    n_trials: int


def first_trials(opened: OpenedStudy, n_trials: int, enqueue: list[str]) -> FirstTrials:
    """The first trials of a run: the baseline, then the maps asked for (`enqueue`, in their order, repaired to
    the budget), then the paper-inspired maps, each only where the study has no trial of it yet, and no more
    than the trials still missing to `n_trials` (so no trial is left WAITING after the run). Maps asked for that
    do not fit in `n_trials` raise it: a resume with other maps trains them, however many trials it had."""
    plan, study, trials = opened.plan, opened.study, opened.trials
    search, n = plan.space.search, plan.model.n_layers
    max_runs = plan.budget.max_layer_runs(plan.model)
    asked = enqueued_maps(plan, enqueue)
    scan = search.sampler == "grid" and "ilr" not in search.families  # every feasible block, once
    seeds = (
        [
            {**p, **knobs_off(search.knobs)}
            for p in first_params(
                n, search.max_reuse, max_runs, search.families, scan, search.parts, plan.budget.pass_costs(plan.model)
            )
        ]
        if search.enqueue_paper_maps or scan
        else []
    )  # with every searched knob off: the paper's model
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,)) if study is not None else []
    known = [t.params for t in trials if t.state != TrialState.FAIL or t.has_result] + [
        t.system_attrs.get("fixed_params", {})
        for t in waiting  # an enqueued trial's parameters
    ]
    required: list[dict[str, Any]] = []
    for params in seeds[:1] + [a.params(search.knobs) for a in asked if a.block is None]:
        if params not in known and params not in required:
            required.append(params)
    counted = sum(t.has_result or t.state in (TrialState.WAITING, TrialState.RUNNING) for t in trials)
    fill = [p for p in seeds[1:] if p not in known and p not in required]
    if scan:  # the scan is the study: every block it has not evaluated yet, whatever n_trials asked
        return FirstTrials(required + fill, sorted({a.block for a in asked if a.block}), counted + len(required + fill))
    n_trials = max(n_trials, counted + len(required))
    return FirstTrials(
        required + fill[: n_trials - counted - len(required)], sorted({a.block for a in asked if a.block}), n_trials
    )


BudgetPhase = Literal["trials", "references", "race"]  # where a time budget stopped a run


@dataclass
class StartGate:
    """Whether a new run may start under the invocation's time budget (`run --time-budget`): asked once before each
    group of trials, of reference runs and of race runs, and only where there is one to start. Once the budget is
    spent it says no for good, says so once, and keeps the phase it stopped (`stopped_in`); runs in flight finish."""

    deadline: Deadline | None
    reporter: RunReporter
    stopped_in: BudgetPhase | None = None

    def __call__(self, phase: BudgetPhase) -> bool:
        if self.deadline is None:
            return True
        if self.stopped_in is None and self.deadline.spent():
            self.stopped_in = phase
            self.reporter.on(
                Message(
                    f"the time budget ({self.deadline.text}) is spent: no new run starts; the same command continues"
                )
            )
        return self.stopped_in is None


def _run_in_process(
    request: RunRequest, reporter: RunReporter, reference_share: tuple[int, int], race_runner: RaceRunner | None
) -> StudyReport:
    request = request.started()  # run directly (the Python API's engine): the budget counts from here
    timeout, fuse = request.timeout, request.trials_fuse
    gate = StartGate(request.deadline, reporter)
    prepared = prepare_study(request)
    space, spec, plan, study, settings, data = (
        prepared.space,
        prepared.spec,
        prepared.plan,
        prepared.study,
        prepared.settings,
        prepared.data,
    )
    store = open_store(spec, plan.name, storage=study_storage(study))
    worker = new_worker()
    worker_number = store.register_worker(worker)
    # Worker k of the study (k = 0 for the first run, 1 for a resume or a second process...) samples from
    # stream k of the study's seed: reproducible, and concurrent workers do not propose the same maps.
    study.sampler = build_sampler(
        settings.sampler,
        plan.model.n_layers,
        space.search.max_reuse,
        plan.budget.max_layer_runs(plan.model),
        worker_number,
        space.search.knobs,
        space.search.families,
        space.search.damping_choices,
    )
    n_trials = prepared.n_trials
    if space.search.sampler == "grid" and "ilr" not in space.search.families:
        reporter.on(Message(f"grid: every feasible block evaluated once, {n_trials - 1} of them and the plain model"))
    elif prepared.n_trials_raised_from is not None:
        reporter.on(
            Message(
                f"--n-trials {prepared.n_trials_raised_from} raised to {n_trials}: the enqueued maps "
                "need trials of their own"
            )
        )
    run = SearchRun(
        plan,
        study,
        store,
        data,
        reporter,
        n_trials,
        request.checkpoints / safe_name(plan.name),
        pruner=build_pruner(settings.pruner, store, space.train.steps),
        lanes=request.layout.trials.lanes if request.layout is not None else 1,
        fuse=fuse,
        worker=worker,
        worker_number=worker_number,
    )
    reporter.on(
        StudyStarted(plan.name, n_trials, n_finished(told_trials(study)), words=race_settings(plan.config).words)
    )
    if request.learn and LEARNED_ATTR in study.user_attrs:
        reporter.on(Message(learned_line(study.user_attrs[LEARNED_ATTR])))

    def report_trial(st: optuna.Study, ft: FrozenTrial) -> None:
        front = save_current_front(store, study_trials(st, store.runs()))
        reporter.on(TrialFinished(trial_record(ft), front, n_finished(told_trials(st))))

    interrupted, told, started = False, False, time.monotonic()
    while not interrupted:
        seen = run.taken_over
        left = None if timeout is None else timeout - (time.monotonic() - started)
        trials = told_trials(study)
        finished = n_finished(trials)
        running = sum(t.state == TrialState.RUNNING for t in trials)
        if (left is not None and left <= 0) or finished >= n_trials:
            break
        if finished + running >= n_trials:
            # Trials in flight (other workers', or a killed worker's until its heartbeat goes stale)
            # would reach n_trials: wait for them rather than overshoot it; a failed one is retried.
            if not told:
                reporter.on(Message(f"waiting for {running} running trial(s) to reach {n_trials}"))
                told = True
            time.sleep(min(2.0, heartbeat_interval()))
            run.sweep_stale()
            continue
        if not gate("trials"):
            break
        try:
            run.run_group(min(fuse, n_trials - finished - running), report_trial)
        except KeyboardInterrupt:
            interrupted = True
        except (TrialTakenOver, ValueError):
            # A trial failed under this worker (Optuna refuses to tell it): its result, if any, is on its
            # map's run, which the queued retry reuses; this worker goes on with the study.
            if run.taken_over == seen:
                raise
    if not interrupted and n_finished(told_trials(study)) >= n_trials:
        train_references(run, reference_share, fuse, lambda: gate("references"))
        if request.race and gate.stopped_in is None:  # contenders at more seeds and longer, until decided (race.py)
            try:
                (race_runner or run_race)(
                    plan,
                    study,
                    store,
                    data,
                    reporter,
                    race_checkpoints(run.checkpoint_root),
                    fuse,
                    plan.space.search.max_race_steps,
                    lambda: gate("race"),
                )
            except KeyboardInterrupt:  # the run in training was freed for the next attempt; finished ones stay
                interrupted = True
    save_current_front(store, study_trials(study, store.runs()))
    for folder in (run.checkpoint_root, *run.checkpoint_root.parents[:2]):  # checkpoints go when their trials end
        try:
            folder.rmdir()
        except OSError:  # not empty (a trial of another worker), or not there
            break
    report = dataclasses.replace(
        study_report(study, spec, store), interrupted=interrupted, settings=settings, time_budget=request.time_budget
    )
    if gate.stopped_in is None or interrupted:
        return report
    return out_of_time(report, gate, n_trials)


def out_of_time(report: StudyReport, gate: StartGate, n_trials: int) -> StudyReport:
    """The report of a run whose time budget stopped it (gate.stopped_in: the phase it stopped in): the answer says
    what was decided and what was not, with the gap the race could have seen by now, and that the same command
    continues."""
    assert gate.deadline is not None and gate.stopped_in is not None
    race = report.race
    if gate.stopped_in == "trials":
        done = f"after {n_finished(report.trials)} of {n_trials} trials"
    elif gate.stopped_in == "references":
        done = f"after the {n_trials} trials, before the reference runs were all trained"
    else:
        done = ""
    answer = out_of_time_answer(
        report.answer,
        gate.deadline.text,
        done,
        race.state if race is not None else None,
        race.settings if race is not None else None,
    )
    return dataclasses.replace(report, answer=answer, out_of_time=True)


def check_fuse(fuse: int) -> None:
    if isinstance(fuse, bool) or not isinstance(fuse, int) or not 1 <= fuse <= SIZE_MAXIMA["search", "fuse"]:
        raise UserInputError(
            f"--fuse must be a positive number of maps trained at once (1: one at a time), at most "
            f"{SIZE_MAXIMA['search', 'fuse']:,}, got {fuse!r}"
        )


def _disk_full_cause(e: BaseException | None) -> BaseException | None:
    """The ENOSPC / `database or disk is full` error behind `e`, following the chain Optuna and SQLAlchemy wrap."""
    while e is not None:
        if getattr(e, "errno", None) == errno.ENOSPC or "disk is full" in str(e) or "No space left" in str(e):
            return e
        e = e.__cause__ or e.__context__
    return None


@contextmanager
def disk_full_is_reported() -> Iterator[None]:
    try:
        yield
    except (optuna.exceptions.StorageInternalError, sa.exc.SQLAlchemyError, OSError) as e:
        cause = _disk_full_cause(e)
        if cause is None:
            raise
        text = str(getattr(cause, "orig", None) or cause).splitlines()
        raise StorageFullError(
            f"the disk holding the storage or checkpoints is full ({text[0] if text else 'ENOSPC'}); "
            "free space, then rerun the same command to resume: finished trials are kept"
        ) from None


def n_finished(trials: Sequence[TrialRecord]) -> int:
    """Trials that produced a result for their map: complete, pruned, or diverged (a study of diverging
    proxies still ends)."""
    return sum(t.has_result for t in trials)


def save_current_front(store: Store, trials: Sequence[TrialRecord]) -> list[FrontRow]:
    """The proxy front of `trials` (study_trials: each with its result on its map's run), stored."""
    front = study_front(trials)
    store.save_front(sum(t.state == TrialState.COMPLETE for t in trials), [p.to_dict() for p in front])
    return front


@dataclass(frozen=True)
class ReferenceRun:
    name: str
    schedule: list[int]
    seed: int
    reuse_map: list[int] | None  # None: block recurrence
    knobs: dict[str, KnobValue] = dataclasses.field(default_factory=dict)  # the searched knobs' settings
    block_map: str | None = None  # the map's key where its counts do not give it: a block map's, or one with parts
    parts: tuple[str, ...] = ()  # which branch each layer repeats (Map.parts)

    @property
    def map_text(self) -> str:
        return self.block_map or Map.of_counts(self.reuse_map or [], self.parts).text


def reference_runs(
    plan: StudyPlan, trials: Sequence[TrialRecord], enqueued_blocks: Sequence[int] = ()
) -> list[ReferenceRun]:
    """The study's reference runs, trained outside the sampler's view: the baseline at extra seeds (its
    seed-to-seed noise band), the best recurrent map (with its knobs) at a second seed (is its place real?),
    block recurrence K where the budget allows it, and the block K asked for with `--enqueue blockK`. The
    baseline and blocks run with the knobs off."""
    n, seed = plan.model.n_layers, plan.space.train.seed
    runs = [
        ReferenceRun(f"baseline_seed{seed + i}", list(range(n)), seed + i, [1] * n)
        for i in range(1, plan.space.search.noise_seeds + 1)
    ]
    best = best_recurrent(trials) if plan.space.search.second_seed_reference else None
    if best is not None:
        best_map = Map.parse({r.number: r for r in trials}[best.trial].map_key or "", n)
        runs.append(
            ReferenceRun(
                "second_seed",
                best_map.schedule(),
                seed + 1,
                as_list(best.reuse_map),
                dict(best.knobs),
                best_map.text if best_map.is_block or best_map.parts else None,
                best_map.parts,
            )
        )
    blocks = set(enqueued_blocks)
    # With blocks searched, the whole stack run K times is the trial block:0-(L-1):K: no reference trains it again.
    if "block" in plan.space.search.families and "blocks" not in plan.space.search.families:
        blocks |= {
            k
            for k in range(2, plan.space.search.max_reuse + 1)
            if plan.budget.allows(flops_ratio(plan.model, block_schedule(n, k)))
        }
    runs += [ReferenceRun(Map.of_stack(k, n).key, block_schedule(n, k), seed, None) for k in sorted(blocks)]
    return runs


def train_references(
    run: SearchRun, share: tuple[int, int] = (0, 1), fuse: int = 1, may_start: MayStart | None = None
) -> None:
    """Train the missing reference runs once per study and store each in the store as it finishes (the second
    seed is trained again when the best recurrent map changed). With `share` (k, n), worker k of n trains
    the k-th, (k+n)-th, ... of them; whoever runs `run` last trains what is still missing. `fuse` K > 1: up
    to K of them of one model train fused, each at its own seed (the same results as one at a time); the run's
    lanes train them side by side. `may_start` is asked before each group: once it says no (the time budget is
    spent), the rest are left to the next run."""
    plan, study = run.plan, run.study
    k, n = share
    trials = study_trials(study, run.store.runs())
    refs = reference_runs(plan, trials, study.user_attrs.get(ENQUEUED_BLOCKS_ATTR, ()))
    done_before = stored_references(run.store.reference_runs())
    missing = []
    for index, ref in enumerate(refs):
        stored = done_before.get(ref.name)
        if index % n == k and not (
            stored is not None and stored.schedule == tuple(ref.schedule) and dict(stored.knobs) == ref.knobs
        ):
            missing.append(ref)
    jobs = [
        Job(
            plan.trial_model(ref.knobs, ref.parts),
            ref.schedule,
            dataclasses.replace(plan.space.train, dtype=plan.dtype, seed=ref.seed),
        )
        for ref in missing
    ]
    done = 0
    job_groups = groups(jobs, fuse)  # runs of one model train fused where the model can be
    fused_with = {i: len(members) for members in job_groups for i in members}
    # in lanes, all at once (the lanes share them out); else one group after another
    batches = [[i for members in job_groups for i in members]] if run.lanes > 1 and jobs else job_groups
    for members in batches:
        if may_start is not None and not may_start():
            return
        for i in members:
            ref = missing[i]
            run.reporter.on(ReferenceStarted(ref.name, done, len(missing), plan.space.train.steps))
            key = config_key(ref.map_text, ref.knobs)
            run.reporter.on(
                Message(
                    f"training reference {ref.name}"
                    + (f" (map {key}, seed {ref.seed})" if ref.name == "second_seed" else "")
                    + (f" (fused, {fused_with[i]} at once)" if fused_with[i] > 1 else "")
                )
            )
            done += 1
        results = train_jobs(
            [jobs[i] for i in members], run.data, fuse, on_step=step_callback(run.reporter), lanes=run.lanes
        )
        for i, result in zip(members, results, strict=True):
            ref, model = missing[i], jobs[i].model
            run.store.save_reference(
                reference_run(
                    ref.name,
                    ref.schedule,
                    ref.seed,
                    flops_ratio(model, ref.schedule),
                    ref.reuse_map,
                    ref.knobs,
                    ref.block_map,
                    finite_or_none(result.val_ppl),
                    finite_or_none(result.val_bpb),
                    result.status,
                    result.steps,
                    [(p.step, p.val_loss) for p in result.curve],
                )
            )
            run.reporter.on(ReferenceFinished(ref.name))
