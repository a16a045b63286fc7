"""The race phase of a study: once the study's trials reach their count, contenders are trained at more seeds and
longer (up to the target length) until the racing policy (racing.py) has decided, reading its state as
race_results.py does.

The race runs (table ilr_race_runs, a run at steps = f x the proxy's steps being one of factor f): the race and
`ilr-search audit` train, claim and read the same rows (an audit's runs are race runs too), so neither trains what
the other has. Each run is claimed per (map, steps, seed) with a heartbeat before it is trained and its result
stored when it ends, so kill -9 loses no finished result, the same command resumes, and concurrent workers never
train one run twice.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import optuna

from ilr_search.analysis.racing import RaceJob, RaceSettings, RaceState
from ilr_search.analysis.results import (
    finite_or_none,
    trained_by_map,
)
from ilr_search.config import ModelConfig, TrainConfig
from ilr_search.search.plan import StudyPlan, safe_name
from ilr_search.search.progress import Message, RunFinished, RunKind, RunReporter, RunsStarted, step_callback
from ilr_search.search.race_results import (
    RACE_CAP_ATTR,
    deep_model,
    race_run_job,
    study_race,
)
from ilr_search.storage import Heartbeat, Run, RunJob, Store, grace_period, heartbeat_interval, new_worker
from ilr_search.storage.trials import TrialRecord, study_trials
from ilr_search.training.flops import baseline_flops_per_token, flops_ratio, forward_flops_per_token
from ilr_search.training.jobs import fusable
from ilr_search.training.schedule import Map, is_baseline_key, reuse_map_schedule

if TYPE_CHECKING:  # torch is loaded only to train or evaluate: reading a race loads none
    from ilr_search.training.frozen import EvalData


def longer_train_config(train: TrainConfig, steps: int, seed: int) -> TrainConfig:
    """The proxy's training settings at another length and seed, with a checkpoint every eighth of the run."""
    return dataclasses.replace(train, steps=steps, seed=seed, checkpoint_every=max(1, steps // 8))


RACE_FOLDER = "race"  # a study's race runs' checkpoints, in the study's checkpoint folder


def race_checkpoints(study_folder: Path) -> Path:
    """The folder of a study's race runs' checkpoints (the race's and the audit's), in `study_folder`, the study's
    own checkpoint folder."""
    return study_folder / RACE_FOLDER


def run_checkpoint(folder: Path, job: RunJob) -> Path:
    """Where a run keeps its checkpoint: the same file for the race and the audit, so either resumes the other's."""
    return folder / f"{job.factor}x-seed{job.seed}-{safe_name(job.map_key.replace(',', '-'))}.pt"


@dataclass(frozen=True)
class RaceRunPlan:
    """A race run: what to train and where its result goes."""

    job: RunJob
    reuse_map: list[int]
    model: ModelConfig
    train_cfg: TrainConfig
    checkpoint: Path
    number: int  # the map's trial
    flops_ratio: float = 0.0  # forward FLOPs per token over the study's all-ones map's
    schedule: list[int] = dataclasses.field(default_factory=list)  # the layer order (a block's is not its counts')


def race_run_plan(
    plan: StudyPlan,
    job: RaceJob,
    by_key: Mapping[str, TrialRecord],
    train: TrainConfig,
    base_steps: int,
    checkpoint_folder: Path,
) -> RaceRunPlan | None:
    """How to train a race job: a trial's map with its knobs, the baseline, or an equal-compute model deepR
    (the study's model with R layers, every FLOP ratio against the study's own all-ones map); None for a map no
    trial of the study trained."""
    stored = race_run_job(job, base_steps)
    if Map.form_of(job.map_key) == "deeper":
        model = deep_model(plan.model, job.map_key)
        schedule = list(range(model.n_layers))
        ratio = forward_flops_per_token(model, schedule) / baseline_flops_per_token(plan.model)
        reuse_map, number = [1] * model.n_layers, 0
    else:
        trial = by_key.get(job.map_key)
        if trial is None and not is_baseline_key(job.map_key):
            return None
        chosen = Map.parse(job.map_key, plan.model.n_layers)
        reuse_map, schedule = list(chosen.counts), chosen.schedule()
        model = plan.trial_model(dict(trial.knobs) if trial is not None else {}, chosen.parts)
        ratio = flops_ratio(model, schedule)
        number = trial.number if trial is not None else 0
    return RaceRunPlan(
        stored,
        reuse_map,
        model,
        longer_train_config(train, job.steps, job.seed),
        run_checkpoint(checkpoint_folder, stored),
        number,
        ratio,
        schedule,
    )


def train_claimed(
    store: Store,
    runs: Sequence[RaceRunPlan],
    worker: str,
    data: EvalData,
    reporter: RunReporter,
    kind: RunKind = "race",
    fuse: int = 1,
) -> None:
    """Train claimed race or audit runs (of one model and length: one fused group where it can be, each at its own
    seed) under one heartbeat for all, and store each result (complete, or failed where it diverged); Ctrl-C frees
    them at once for the next attempt (their checkpoints stay)."""
    from ilr_search.training.jobs import (  # here, not at the top: reading a race's results loads no torch
        Job,
        train_jobs,
    )

    reporter.on(RunsStarted(tuple((r.job.map_key, r.train_cfg.steps, r.job.seed) for r in runs), kind))
    jobs = [
        Job(r.model, r.schedule or reuse_map_schedule(r.reuse_map), r.train_cfg, checkpoint=r.checkpoint) for r in runs
    ]

    def beat() -> bool:
        for r in runs:
            store.beat_run("race", r.job, worker)
        return True  # the runs beat until they are trained

    try:
        with Heartbeat(beat):
            results = train_jobs(jobs, data, fuse=max(fuse, len(runs)), on_step=step_callback(reporter))
    except KeyboardInterrupt:
        for r in runs:
            store.finish_run("race", r.job, worker, "interrupted", None, None, None, [], 0.0, "interrupted (Ctrl-C)")
        raise
    for r, result in zip(runs, results, strict=True):
        state = "complete" if result.status == "ok" else "failed"
        store.finish_run(
            "race",
            r.job,
            worker,
            state,
            finite_or_none(result.val_loss),
            finite_or_none(result.val_ppl),
            finite_or_none(result.val_bpb),
            [(p.step, p.val_loss) for p in result.curve],
            result.train_seconds,
            result.reason,
            result.scores,
        )
        r.checkpoint.unlink(missing_ok=True)
        reporter.on(
            RunFinished(
                r.job.map_key, r.train_cfg.steps, r.job.seed, finite_or_none(result.val_ppl), kind, tokens=result.tokens
            )
        )


def finished_jobs(store: Store) -> set[RunJob]:
    """The race runs with a final result (complete, or failed: diverged), which no worker trains again."""
    return {r.job for r in store.race_runs() if r.finished}


def drop_finished_checkpoints(store: Store, folder: Path) -> None:
    """Delete the checkpoints of the runs that have a final result, and `folder` once it is empty. A run's own
    worker deletes its checkpoint after storing the result; a worker stopped between the two leaves it behind, and
    no later attempt trains that run again, so the end of the race or the audit sweeps it."""
    for job in finished_jobs(store):
        run_checkpoint(folder, job).unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:  # not empty (another worker's run), or not there
        pass


WAIT_POLL_SECONDS = 0.2  # how often a waiting worker looks whether another worker's runs have changed


def runs_changed(store: Store) -> Callable[[], object]:
    """A look at the study's race runs that changes when a run is claimed, finished or given up (not on a
    heartbeat): what a waiting worker watches (one read of the runs)."""
    return lambda: tuple((r.job, r.worker, r.state) for r in store.race_runs())


def wait_for_change(look: Callable[[], object], seconds: float) -> None:
    """Sleep until `look()` gives another answer than at the start (looked at every WAIT_POLL_SECONDS), or for
    `seconds` at most."""
    seen = look()
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(WAIT_POLL_SECONDS, left))
        if look() != seen:
            return


def claim_train_wait(
    claim: Callable[[], Sequence[RaceRunPlan] | None],
    train: Callable[[Sequence[RaceRunPlan]], None],
    reporter: RunReporter,
    waiting: str,
    look: Callable[[], object],
) -> None:
    """The loop of the race and of the audit: `claim` claims the next group of runs (None: nothing is left that
    this worker can train; empty: what is left is held by live workers), `train` trains a claimed group and stores
    its results, and `claim` is asked again after each group (the results may change what is left). While the
    rest is held by other workers, it waits until `look` (runs_changed) says that a run was finished or given up,
    or at most a heartbeat interval (held runs go stale and can be claimed), saying `waiting` once a wait."""
    waiting_said = False
    while (claimed := claim()) is not None:
        if claimed:
            train(claimed)
            waiting_said = False
            continue
        if not waiting_said:
            reporter.on(Message(waiting))
            waiting_said = True
        wait_for_change(look, min(2.0, heartbeat_interval()))


MayStart = Callable[[], bool]
"""Asked before each new group of runs: False once the invocation's time budget is spent (no new run starts)."""

RaceRunner = Callable[
    [StudyPlan, optuna.Study, Store, "EvalData", RunReporter, Path, int, int, "MayStart | None"], object
]
"""What trains a study's race: run_race's first nine arguments (plan, study, store, data, reporter, checkpoint
folder, fuse, max_steps, may_start)."""


def open_race_jobs(
    study: optuna.Study, store: Store, max_steps: int | None
) -> tuple[list[RaceJob], RaceSettings, RaceState]:
    """The runs the racing policy asks for now that the storage does not hold yet (none where the race is done or
    off), with the race's settings and state, read from the study as it stands."""
    settings, results, state = study_race(study.user_attrs, store.runs(), max_steps)
    have = {(r.map_key, r.steps, r.seed) for r in results}
    open_jobs = [j for j in state.next_jobs if (j.map_key, j.steps, j.seed) not in have]
    if state.done or not settings.races:  # (a race that is off trains nothing, not even an untrained baseline)
        open_jobs = []
    return open_jobs, settings, state


def held_runs(rows: Sequence[Run], worker: str) -> set[RunJob]:
    """The runs that other live workers train (their heartbeat within the grace period)."""
    now = time.time()
    return {r.job for r in rows if r.state == "running" and r.worker != worker and now - r.heartbeat <= grace_period()}


def fused_groups(runs: Sequence[RaceRunPlan], limit: int) -> list[list[RaceRunPlan]]:
    """`runs`, in the policy's order, as the groups that train together: from the first run not yet in a group, the
    later runs of its length and model up to `limit` runs, ending at the first run of another length; a model that
    cannot be fused trains alone. The groups depend only on the runs, so that two workers that look at the same
    runs at the same moment form the same groups, and a run's group (which sets its rounding) never depends on which
    worker claims first."""
    left = list(runs)
    groups: list[list[RaceRunPlan]] = []
    while left:
        first = left.pop(0)
        group = [first]
        if fusable(first.model):
            for run in list(left):
                if len(group) >= limit or run.train_cfg.steps != first.train_cfg.steps:
                    break
                if run.model == first.model:
                    group.append(run)
                    left.remove(run)
        groups.append(group)
    return groups


def run_race(
    plan: StudyPlan,
    study: optuna.Study,
    store: Store,
    data: EvalData,
    reporter: RunReporter,
    checkpoint_folder: Path,
    fuse: int = 1,
    max_steps: int | None = None,
    may_start: MayStart | None = None,
    workers: int = 1,
) -> RaceState:
    """Train what the racing policy asks for, reading every result again after each run (or each fused group
    of up to `fuse` runs of one length and model), until it is done (or asks only for runs that exist); runs
    held by live workers are waited for. `max_steps`: the compute cap this run races under (stored with the study,
    so that reports read the race as this run left it; None: the study's last). `may_start`: asked before a group
    is claimed while the policy asks for runs; once it says no (the time budget is spent), the race stops there,
    undecided, and the same command goes on. `workers`: race workers sharing the runs, each taking at most its
    share of a wave."""
    worker = new_worker()
    train = dataclasses.replace(plan.space.train, dtype=plan.dtype)
    if max_steps is not None and study.user_attrs.get(RACE_CAP_ATTR) != max_steps:
        study.set_user_attr(RACE_CAP_ATTR, max_steps)
    state: RaceState | None = None

    def claim() -> list[RaceRunPlan] | None:
        """The next group the policy asks for: up to this worker's share of `fuse` runs of one length and model."""
        nonlocal state
        open_jobs, settings, state = open_race_jobs(study, store, max_steps)
        if not open_jobs or (may_start is not None and not may_start()):
            return None
        by_key = trained_by_map(study_trials(study, store.runs()))
        runs = [
            run
            for job in open_jobs
            if (run := race_run_plan(plan, job, by_key, train, settings.base_steps, checkpoint_folder)) is not None
        ]
        if not runs:  # only runs of maps no trial trained: nothing says how to build them
            reporter.on(
                Message(
                    f"race: cannot train {', '.join(j.map_key for j in open_jobs)} (no trial of the study trained it)"
                )
            )
            return None
        limit = max(1, min(fuse, -(-len(open_jobs) // max(1, workers))))
        held = held_runs(store.race_runs(), worker)
        for group in fused_groups([r for r in runs if r.job not in held], limit):
            if claim_run(group[0]):  # else another worker that saw the same runs took this group
                return [group[0], *(r for r in group[1:] if claim_run(r))]
        return []

    def claim_run(run: RaceRunPlan) -> bool:
        return store.claim_run(
            "race", run.job, worker, run.flops_ratio, run.train_cfg.steps, stale_after=grace_period()
        )

    claim_train_wait(
        claim,
        lambda runs: train_claimed(store, runs, worker, data, reporter, fuse=fuse),
        reporter,
        f"the race's remaining runs are being {'evaluated' if train.steps == 0 else 'trained'} by other workers; "
        "waiting",
        runs_changed(store),
    )
    drop_finished_checkpoints(store, checkpoint_folder)
    assert state is not None  # claim ran at least once
    return state
