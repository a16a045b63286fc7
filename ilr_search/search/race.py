"""The race phase of a study: once the study's trials reach their count, contenders are trained at
more seeds and longer (up to the target length) until the racing policy (racing.py) has decided.

Every result of the study is read as one (map, steps, seed) evaluation: the trials' results at the proxy's
length and the space's seed, the reference runs (the baseline and the best map at extra seeds), and the
longer or extra-seed runs. Those are the race runs (table ilr_race_runs, a run at steps = f x the proxy's
steps being one of factor f): the race and `ilr-search audit` train, claim and read the same rows (an audit's
runs are race runs too), so neither trains what the other has. Each run is claimed per (map, steps, seed) with a
heartbeat before it is trained and its result stored when it ends, so kill -9 loses no finished result, the same
command resumes, and concurrent workers never train one run twice.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import optuna
from optuna.trial import TrialState

from ilr_search.analysis.answer import Answer, Trust, judge_answer, race_answer, unraced_answer
from ilr_search.analysis.race_core import REFERENCE_SOURCE, RUN_SOURCE, TRIAL_SOURCE, EqualCompute, StoredResult
from ilr_search.analysis.race_report import DecidedBest, RaceReport
from ilr_search.analysis.racing import FrontPoint, RaceJob, RaceSettings, RaceState, race_state
from ilr_search.analysis.results import (
    DEEP_PREFIX,
    REFERENCE_PREFIX,
    FrontRow,
    finite_or_none,
    is_baseline_key,
    is_deep_key,
    key_reuse_map,
    knobs_text,
    map_text,
    study_front,
    trained_by_map,
    trained_trials,
)
from ilr_search.analysis.trials import Trial, TrialRecord, trial_records
from ilr_search.config import ITEM_OBJECTIVES, ModelConfig, SpaceConfig, TrainConfig, factor_key, race_target_steps
from ilr_search.knobs import config_key
from ilr_search.search.plan import CONFIG_ATTR, LR_SCHEDULE_FIELDS, StudyPlan, safe_name
from ilr_search.search.progress import Message, RunFinished, RunKind, RunReporter, RunsStarted, step_callback
from ilr_search.storage import Heartbeat, RaceRun, RaceRunJob, Store, grace_period, heartbeat_interval
from ilr_search.training.flops import baseline_flops_per_token, flops_ratio, forward_flops_per_token, param_count
from ilr_search.training.jobs import fusable
from ilr_search.training.schedule import ReuseMap, format_reuse_map, map_of_key, reuse_map_schedule

if TYPE_CHECKING:  # torch is loaded only to train or evaluate: reading a race loads none
    from ilr_search.training.frozen import EvalData

FINAL_STATES = ("complete", "failed")  # of a race run; failed: the run diverged, it is not trained again


# A frozen comparison paired by window needs its mean loss difference beyond this to be claimed: far below any gap
# worth a claim (0.01% of perplexity), far above the float rounding of two paths to the same numbers.
CLAIM_MARGIN_NATS = 1e-4

RACE_CAP_ATTR = "ilr:max_race_steps"  # the compute cap the study's last run raced under (0: none)


def race_settings(config: Mapping[str, Any], max_steps: int | None = None) -> RaceSettings:
    """The race of a study from its stored configuration (its race settings stored only where not the defaults of
    STORED_OMITTED_DEFAULTS, which SpaceConfig.from_dict reads back): the proxy's length, the target length, the
    seeds from the space's seed up (the fixed race's race_seeds, the adaptive race's pool of max_seeds), and the
    compute cap `max_steps` (None or 0: none)."""
    space = SpaceConfig.from_dict(config)
    base_steps, seed, search = space.train.steps, space.train.seed, space.search
    fixed = search.race_policy == "fixed"
    items = search.objective in ITEM_OBJECTIVES
    race = RaceSettings(
        base_steps,
        race_target_steps(search.target, base_steps),
        tuple(seed + i for i in range(search.race_seeds if fixed else search.max_seeds)),
        race_contenders=search.race_contenders,
        policy="fixed" if fixed else "adaptive",
        max_steps=max_steps or None,
        judged="accuracy" if items else "answer" if search.objective == "answer" else "ppl",
        items=items,
        two_sided=search.judge,
        blocks="ilr" not in search.families,
        margin=CLAIM_MARGIN_NATS if base_steps == 0 and not items else 0.0,
    )
    if fixed:
        return race
    model = space.model
    share = (param_count(dataclasses.replace(model, n_layers=model.n_layers + 1)) - param_count(model)) / param_count(
        model
    )
    # a frozen study: a seed is a chunk of held-out windows, and there is no deeper plain model
    frozen = base_steps == 0
    return dataclasses.replace(
        race,
        race_seeds=search.race_seeds,
        race_screen=search.race_screen,
        look_every=search.look_every,
        equal_compute=search.equal_compute == "depth" and not frozen,
        layer_param_share=share,
        frozen=frozen,
    )


def lr_schedule(config: Mapping[str, Any]) -> str:
    """The learning-rate schedule every run of the study is trained with (train.lr_at), over its own length."""
    train = config["train"]
    return TrainConfig(
        **{k: train[k] for k in (*LR_SCHEDULE_FIELDS, "warmup_frac", "min_lr_frac") if k in train}
    ).lr_schedule_text()


def race_run_job(job: RaceJob, base_steps: int) -> RaceRunJob:
    return RaceRunJob(factor_key(job.steps / base_steps if base_steps else 0), job.seed, job.map_key)


def stored_results(
    trials: Sequence[Trial], study_attrs: Mapping[str, Any], rows: Sequence[RaceRun]
) -> list[StoredResult]:
    """Every finished result of the study, one per (map, steps, seed): the trials' at the proxy's length
    (complete or diverged; a pruned trial has no result at a length the race knows), the reference runs of
    reuse maps, and the finished race runs; the first source of a (map, steps, seed) wins, in that
    order."""
    config = study_attrs[CONFIG_ATTR]
    base_steps, base_seed = int(config["train"]["steps"]), int(config["train"]["seed"])
    schedule = lr_schedule(config)
    found: list[StoredResult] = []
    for t in sorted(trained_trials(list(trials)), key=lambda t: t.number):
        if t.state == TrialState.PRUNED:
            continue
        loss = t.val_loss if t.state == TrialState.COMPLETE else None
        assert t.map_key is not None and t.flops_ratio is not None  # a trial that trained its map has both
        found.append(
            StoredResult(
                t.map_key,
                t.flops_ratio,
                base_steps,
                base_seed,
                schedule,
                loss,
                t.val_ppl if loss is not None else None,
                t.val_bpb if loss is not None else None,
                f"{TRIAL_SOURCE}{t.number}",
            )
        )
    for name, ref in sorted(study_attrs.items()):
        if not name.startswith(REFERENCE_PREFIX) or not ref.get("reuse_map"):  # block recurrence is no reuse map
            continue
        ppl = ref.get("val_ppl")
        key = config_key(ref.get("map") or format_reuse_map(ref["reuse_map"]), ref.get("knobs", {}))
        found.append(
            StoredResult(
                key,
                float(ref["flops_ratio"]),
                base_steps,
                int(ref["seed"]),
                schedule,
                math.log(ppl) if ppl else None,
                ppl,
                ref.get("val_bpb"),
                f"{REFERENCE_SOURCE}{name[len(REFERENCE_PREFIX) :]}",
            )
        )
    for r in rows:
        if r.state in FINAL_STATES:
            loss = r.val_loss if r.state == "complete" else None
            found.append(
                StoredResult(
                    r.job.map_key,
                    r.flops_ratio,
                    r.steps,
                    r.job.seed,
                    schedule,
                    loss,
                    r.val_ppl if loss is not None else None,
                    r.val_bpb,
                    f"{RUN_SOURCE}{r.job.factor}x",
                    r.scores if loss is not None else (),
                )
            )
    unique: dict[tuple[str, int, int], StoredResult] = {}
    for result in found:
        unique.setdefault((result.map_key, result.steps, result.seed), result)
    return list(unique.values())


def study_race(
    trials: Sequence[Trial], study_attrs: Mapping[str, Any], rows: Sequence[RaceRun], max_steps: int | None = None
) -> tuple[RaceSettings, list[StoredResult], RaceState]:
    """The race's settings, the study's results, and the policy's decision on them. The policy sees the maps
    a trial trained to the proxy's length (and the baseline), and the equal-compute models (deepR): a pruned
    map that the audit retrained is no contender, and the race does not train it to the proxy's length to make it
    one. The compute cap: `max_steps`, or the one the study's last run raced under."""
    config = study_attrs[CONFIG_ATTR]
    settings = race_settings(config, max_steps if max_steps is not None else study_attrs.get(RACE_CAP_ATTR))
    results = stored_results(trials, study_attrs, rows)
    baseline = ReuseMap.baseline(int(config["model"]["n_layers"])).key
    raced = {r.map_key for r in results if r.is_trial} | {baseline}
    evaluations = [r.evaluation() for r in results if r.map_key in raced or is_deep_key(r.map_key)]
    return settings, results, race_state(evaluations, settings, baseline)


def deep_model(model: ModelConfig, key: str) -> ModelConfig:
    """The equal-compute model deepR: the study's model (its knobs off) with R layers, each run once."""
    return dataclasses.replace(model, n_layers=layer_runs_of_deep(key))


def layer_runs_of_deep(key: str) -> int:
    return int(key[len(DEEP_PREFIX) :])


def json_interval(interval: tuple[float, float]) -> tuple[float | None, float | None]:
    """(low, high) ppl; (None, None) where the policy has none (one seed: it says (0, inf))."""
    low, high = interval
    return (low, high) if math.isfinite(low) and math.isfinite(high) and low > 0 else (None, None)


RACE_POINT_FIELDS = (
    "steps",
    "seeds",
    "interval",
    "confirmed",
    "reference",
)  # what a race front point adds to a proxy one


def proxy_points(trials: Sequence[Trial], settings: RaceSettings) -> tuple[FrontPoint, ...]:
    """The proxy's front (study_front) as front points: the proxy's length, the space's seed, no interval, not
    confirmed."""
    records = trial_records(trials)
    keys = {r.number: r.map_key for r in records if r.map_key is not None}  # the front's trials all have theirs
    return tuple(
        FrontPoint(
            keys[cast(int, p.trial)],  # a proxy front point is a trial's
            p.flops_ratio,
            settings.base_steps,
            settings.seeds[:1],
            p.val_ppl,
            (0.0, math.inf),
            False,
        )
        for p in study_front(records)
    )


def front_rows(
    points: Sequence[FrontPoint], trials: Sequence[Trial], results: Sequence[StoredResult]
) -> list[FrontRow]:
    """Front points as the reports show them (the `pareto` items of `run --json` and `pareto --json`): each point's
    trial, map, knobs and FLOPs, its mean perplexity over its seeds at its length, the interval, and whether it is
    confirmed (better than the cheaper points; val_bpb: the mean over the same runs). The baseline is the point the
    others are judged against: `is_baseline`, never `confirmed`."""
    by_key = trained_by_map(list(trials))
    bpb = {(r.map_key, r.steps, r.seed): r.val_bpb for r in results}
    rows = []
    for p in points:
        t = by_key.get(p.map_key)
        bpbs = [bpb.get((p.map_key, p.steps, s)) for s in p.seeds]
        known_bpbs = [b for b in bpbs if b is not None]
        baseline = is_baseline_key(p.map_key)
        rows.append(
            FrontRow(
                trial=t.number if t is not None else None,
                reuse_map=t.reuse_map if t is not None else tuple(key_reuse_map(p.map_key)),
                map=map_text(p.map_key),
                knobs=knobs_text(t) if t is not None else None,
                flops_ratio=p.flops_ratio,
                val_ppl=p.val_ppl,
                val_bpb=sum(known_bpbs) / len(bpbs) if bpbs and len(known_bpbs) == len(bpbs) else None,
                params=t.param_count if t is not None else None,
                steps=p.steps,
                seeds=tuple(p.seeds),
                interval=json_interval(p.interval),
                confirmed=p.confirmed and not baseline,
                is_baseline=baseline,
            )
        )
    return rows


def race_report(trials: Sequence[Trial], study_attrs: Mapping[str, Any], rows: Sequence[RaceRun]) -> RaceReport | None:
    """What `run`, `pareto`, `trials` and `studies` report of the race (analysis/race_report.py): its settings, every
    stored result, the policy's state, the decided front, the equal-compute comparison and the answer; None for a
    study not made by ilr-search (it has no race)."""
    if CONFIG_ATTR not in study_attrs:
        return None
    trials = trial_records(trials)
    settings, results, state = study_race(trials, study_attrs, rows)
    points = decided_points(trials, settings, state)
    equal = equal_compute_report(state.equal_compute, SpaceConfig.from_dict(study_attrs[CONFIG_ATTR]).model)
    front = front_rows(points, trials, results)
    return RaceReport(
        settings,
        tuple(results),
        state,
        tuple(front),
        decided_best(state, front),
        equal,
        study_answer(study_attrs, settings, results, state),
    )


def foreign_answer(trials: Sequence[Trial]) -> Answer:
    """The answer of a study not made by ilr-search: it has no race."""
    steps = max((t.steps for t in trial_records(trials)), default=0)
    return unraced_answer("the study was not made by ilr-search (no race)", steps)


def replicate_unit(settings: RaceSettings) -> str:
    """What one replicate of a map is called in the study's answer: a training seed, or in a frozen study (no
    training) a chunk of held-out windows (RaceWords)."""
    return settings.words.unit


def study_answer(
    study_attrs: Mapping[str, Any], settings: RaceSettings, results: Sequence[StoredResult], state: RaceState
) -> Answer:
    """The study's answer line and details (analysis/answer.py): the race's, with the plain model's mean perplexity
    at the race's length and the screen's proxy-to-target rank agreement; where the race trains nothing, that no map
    was tested."""
    if not settings.races:
        return unraced_answer(
            f"the race is off (one {replicate_unit(settings)} at the proxy's length, no test)", settings.base_steps
        )
    steps = state.level_steps or settings.target_steps
    baseline = ReuseMap.baseline(int(study_attrs[CONFIG_ATTR]["model"]["n_layers"])).key
    losses = [r.val_loss for r in results if r.map_key == baseline and r.steps == steps and r.val_loss is not None]
    baseline_ppl = math.exp(math.fsum(losses) / len(losses)) if losses else None
    agreement = state.screen.agreement if state.screen is not None else None
    trust = (
        Trust(agreement.spearman, agreement.maps, settings.base_steps, settings.target_steps)
        if agreement is not None
        and agreement.spearman is not None
        and agreement.maps >= 3
        and settings.target_steps > settings.base_steps
        else None
    )
    if settings.two_sided:
        return judge_answer(state, settings, judged_model(study_attrs[CONFIG_ATTR]), baseline_ppl)
    return race_answer(state, settings, baseline, baseline_ppl, replicate_unit(settings), trust)


def judged_model(config: Mapping[str, Any]) -> str:
    """The model a judge study judges, as its answer names it: its checkpoint's file or folder name."""
    source = str(config.get("init", {}).get("source") or SpaceConfig.from_dict(config).model.init or "the model")
    return source[3:] if source.startswith("hf:") else Path(source).name


def decided_points(trials: Sequence[Trial], settings: RaceSettings, state: RaceState) -> tuple[FrontPoint, ...]:
    """The front the study decided: the race's (each point at its raced length, with its seeds and interval)
    where the study races and the race has a front; the proxy's otherwise (the race off, or before it has its
    contenders: base results missing)."""
    return state.front if settings.races and state.front else proxy_points(trials, settings)


def decided_front(trials: Sequence[Trial], race: RaceReport | None) -> list[FrontRow]:
    """The decided front as rows: the race's (decided_points); for a study not made by ilr-search, which has no
    race, the proxy's front (study_front). What the figure's layer heatmap, `pareto --view layers` and the default
    map of `recipe` and `train --from-study` read."""
    return list(race.front) if race is not None else study_front(trial_records(trials))


def decided_best(state: RaceState, rows: Sequence[FrontRow]) -> DecidedBest | None:
    """The map the race reports (a map claimed better than the baseline, else the baseline: nothing beats it) with
    its front row's perplexity, length and seeds; None before the race has a front."""
    if state.best is None:
        return None
    row = next((r for r in rows if r.key == state.best), None)
    return DecidedBest(
        map=state.best,
        beats_baseline=state.best in state.confirmed_better,
        done=state.done,
        val_ppl=row.val_ppl if row else None,
        steps=row.steps if row else None,
        seeds=row.seeds if row else None,
    )


def equal_compute_report(equal: EqualCompute | None, model: ModelConfig) -> EqualCompute | None:
    """The race's equal-compute comparison with the deep model's parameter count beside the study's model's."""
    if equal is None:
        return None
    deep = deep_model(model, equal.deep_key)
    return dataclasses.replace(
        equal,
        params=param_count(deep),
        baseline_params=param_count(model),
        params_ratio=param_count(deep) / param_count(model),
    )


# ----------------------------------------------------------------------------------------------------
# Training the runs (the race's and the audit's)


def longer_train_config(train: TrainConfig, steps: int, seed: int) -> TrainConfig:
    """The proxy's training settings at another length and seed, with a checkpoint every eighth of the run."""
    return dataclasses.replace(train, steps=steps, seed=seed, checkpoint_every=max(1, steps // 8))


RACE_FOLDER = "race"  # a study's race runs' checkpoints, in the study's checkpoint folder
OLD_RACE_FOLDER = "audit"  # the same folder as studies run before it was named race have it


def race_checkpoints(study_folder: Path) -> Path:
    """The folder of a study's race runs' checkpoints (the race's and the audit's), in `study_folder`, the study's
    own checkpoint folder."""
    return study_folder / RACE_FOLDER


def run_checkpoint(folder: Path, job: RaceRunJob) -> Path:
    """Where a run keeps its checkpoint: the same file for the race and the audit, so either resumes the other's."""
    return folder / f"{job.factor}x-seed{job.seed}-{safe_name(job.map_key.replace(',', '-'))}.pt"


def adopt_old_checkpoint(checkpoint: Path) -> None:
    """Move a run's checkpoint left in the old folder (OLD_RACE_FOLDER, beside RACE_FOLDER) to `checkpoint`, so that
    a run of a study started before the rename resumes from it; nothing where there is none, or a newer one."""
    old = checkpoint.parent.parent / OLD_RACE_FOLDER / checkpoint.name
    if checkpoint.exists() or not old.exists():
        return
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    old.replace(checkpoint)
    try:
        old.parent.rmdir()
    except OSError:  # other runs' checkpoints are still there
        pass


@dataclass(frozen=True)
class ClaimedRun:
    """A race run: what to train and where its result goes."""

    job: RaceRunJob
    reuse_map: list[int]
    model: ModelConfig
    train_cfg: TrainConfig
    checkpoint: Path
    number: int  # the map's trial
    flops_ratio: float = 0.0  # forward FLOPs per token over the study's all-ones map's
    schedule: list[int] = dataclasses.field(default_factory=list)  # the layer order (a block's is not its counts')


def planned_run(
    plan: StudyPlan,
    job: RaceJob,
    by_key: Mapping[str, TrialRecord],
    train: TrainConfig,
    base_steps: int,
    checkpoint_folder: Path,
) -> ClaimedRun | None:
    """How to train a race job: a trial's map with its knobs, the baseline, or an equal-compute model deepR
    (the study's model with R layers, every FLOP ratio against the study's own all-ones map); None for a map no
    trial of the study trained."""
    stored = race_run_job(job, base_steps)
    if is_deep_key(job.map_key):
        model = deep_model(plan.model, job.map_key)
        schedule = list(range(model.n_layers))
        ratio = forward_flops_per_token(model, schedule) / baseline_flops_per_token(plan.model)
        reuse_map, number = [1] * model.n_layers, 0
    else:
        trial = by_key.get(job.map_key)
        if trial is None and not is_baseline_key(job.map_key):
            return None
        chosen = map_of_key(job.map_key, plan.model.n_layers)
        reuse_map, schedule = list(chosen.counts), chosen.schedule()
        model = plan.trial_model(dict(trial.knobs) if trial is not None else {})
        ratio = flops_ratio(model, schedule)
        number = trial.number if trial is not None else 0
    return ClaimedRun(
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
    runs: Sequence[ClaimedRun],
    worker: str,
    data: EvalData,
    reporter: RunReporter,
    kind: RunKind = "race",
) -> None:
    """Train claimed race or audit runs (of one model and length: one fused group where it can be, each at its own
    seed) under one heartbeat for all, and store each result (complete, or failed where it diverged); Ctrl-C frees
    them at once for the next attempt (their checkpoints stay)."""
    from ilr_search.training.jobs import (  # here, not at the top: reading a race's results loads no torch
        Job,
        train_jobs,
    )

    reporter.on(RunsStarted(tuple((r.job.map_key, r.train_cfg.steps, r.job.seed) for r in runs), kind))
    for r in runs:
        adopt_old_checkpoint(r.checkpoint)
    jobs = [
        Job(r.model, r.schedule or reuse_map_schedule(r.reuse_map), r.train_cfg, checkpoint=r.checkpoint) for r in runs
    ]

    def beat() -> bool:
        for r in runs:
            store.beat_race_run(r.job, worker)
        return True  # the runs beat until they are trained

    try:
        with Heartbeat(beat):
            results = train_jobs(jobs, data, fuse=len(runs), on_step=step_callback(reporter))
    except KeyboardInterrupt:
        for r in runs:
            store.finish_race_run(r.job, worker, "interrupted", None, None, None, [], 0.0, "interrupted (Ctrl-C)")
        raise
    for r, result in zip(runs, results, strict=True):
        state = "complete" if result.status == "ok" else "failed"
        store.finish_race_run(
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


def finished_jobs(store: Store) -> set[RaceRunJob]:
    """The race runs with a final result (complete, or failed: diverged), which no worker trains again."""
    return {r.job for r in store.race_runs() if r.state in FINAL_STATES}


def new_worker() -> str:
    """A name for this worker in the claims it holds: host, process and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


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
    claim: Callable[[], Sequence[ClaimedRun] | None],
    train: Callable[[Sequence[ClaimedRun]], None],
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


RaceRunner = Callable[[StudyPlan, optuna.Study, Store, "EvalData", RunReporter, Path, int, int], object]
"""What trains a study's race: run_race's first eight arguments (plan, study, store, data, reporter, checkpoint
folder, fuse, max_steps)."""


def open_race_jobs(
    study: optuna.Study, store: Store, max_steps: int | None
) -> tuple[list[RaceJob], RaceSettings, RaceState]:
    """The runs the racing policy asks for now that the storage does not hold yet (none where the race is done or
    off), with the race's settings and state, read from the study as it stands."""
    trials = trial_records(study.get_trials(deepcopy=False))
    settings, results, state = study_race(trials, study.user_attrs, store.race_runs(), max_steps)
    have = {(r.map_key, r.steps, r.seed) for r in results}
    open_jobs = [j for j in state.next_jobs if (j.map_key, j.steps, j.seed) not in have]
    if state.done or not settings.races:  # (a race that is off trains nothing, not even an untrained baseline)
        open_jobs = []
    return open_jobs, settings, state


def held_runs(rows: Sequence[RaceRun], worker: str) -> set[RaceRunJob]:
    """The runs that other live workers train (their heartbeat within the grace period)."""
    now = time.time()
    return {r.job for r in rows if r.state == "running" and r.worker != worker and now - r.heartbeat <= grace_period()}


def fused_groups(runs: Sequence[ClaimedRun], limit: int) -> list[list[ClaimedRun]]:
    """`runs`, in the policy's order, as the groups that train together: from the first run not yet in a group, the
    later runs of its length and model up to `limit` runs, ending at the first run of another length; a model that
    cannot be fused trains alone. The groups depend only on the runs, so that two workers that look at the same
    runs at the same moment form the same groups, and a run's group (which sets its rounding) never depends on which
    worker claims first."""
    left = list(runs)
    groups: list[list[ClaimedRun]] = []
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
    workers: int = 1,
) -> RaceState:
    """Train what the racing policy asks for, reading every result again after each run (or each fused group
    of up to `fuse` runs of one length and model), until it is done (or asks only for runs that exist); runs
    held by live workers are waited for. `max_steps`: the compute cap this run races under (stored with the study,
    so that reports read the race as this run left it; None: the study's last). `workers`: race workers sharing
    the runs, each taking at most its share of a wave."""
    worker = new_worker()
    train = dataclasses.replace(plan.space.train, dtype=plan.dtype)
    if max_steps is not None and study.user_attrs.get(RACE_CAP_ATTR) != max_steps:
        study.set_user_attr(RACE_CAP_ATTR, max_steps)
    state: RaceState | None = None

    def claim() -> list[ClaimedRun] | None:
        """The next group the policy asks for: up to this worker's share of `fuse` runs of one length and model."""
        nonlocal state
        open_jobs, settings, state = open_race_jobs(study, store, max_steps)
        if not open_jobs:
            return None
        by_key = trained_by_map(trial_records(study.get_trials(deepcopy=False)))
        runs = [
            run
            for job in open_jobs
            if (run := planned_run(plan, job, by_key, train, settings.base_steps, checkpoint_folder)) is not None
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

    def claim_run(run: ClaimedRun) -> bool:
        return store.claim_race_run(run.job, worker, run.flops_ratio, run.train_cfg.steps, stale_after=grace_period())

    claim_train_wait(
        claim,
        lambda runs: train_claimed(store, runs, worker, data, reporter),
        reporter,
        f"the race's remaining runs are being {'evaluated' if train.steps == 0 else 'trained'} by other workers; "
        "waiting",
        runs_changed(store),
    )
    try:
        checkpoint_folder.rmdir()
    except OSError:  # not empty (another worker's run), or not there
        pass
    assert state is not None  # claim ran at least once
    return state
