"""`run --dry-run`: the plan of a study (name, what is left to train of its trials, references and race, pruning
rungs, storage, space) and an estimate of the time that is left, from a short timed probe of the cheapest and the
costliest schedule on the layout the run would use (its fused group size and threads). It writes nothing: no
storage, no study, no token cache (the probe trains on random tokens: a step's time does not depend on their
values), no checkpoint."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ilr_search.analysis.race_core import RaceSettings, race_lengths
from ilr_search.analysis.sequential import looks_apart
from ilr_search.commands.autofuse import Layout, describe, resolve_layout
from ilr_search.commands.layout import on_cpu, process_threads, race_processes, usable_cores
from ilr_search.config import Dtype, ModelConfig, SpaceConfig, TrainConfig, race_target_steps, races
from ilr_search.data.tokens import TokenData, cache_key, cache_root, random_tokens
from ilr_search.records import record_json
from ilr_search.search.maps import repair_to_budget
from ilr_search.search.plan import StudyPlan
from ilr_search.search.pruners import pruner_settings
from ilr_search.search.race_results import study_race
from ilr_search.search.run import (
    OpenedStudy,
    ReferenceRun,
    RunRequest,
    enqueue_texts,
    first_trials,
    open_request,
    reference_runs,
)
from ilr_search.search.samplers import sampler_settings
from ilr_search.storage import open_store, study_references
from ilr_search.time_budget import format_duration
from ilr_search.training.device import resolve_compile, resolve_device
from ilr_search.training.flops import flops_ratio
from ilr_search.training.jobs import fusable
from ilr_search.training.schedule import reuse_map_schedule
from ilr_search.training.train import train_proxy

PROBE_WARMUP = 2  # untimed steps first: memory allocated, kernels chosen, caches warm
PROBE_TIMED = 7  # timed steps per probed schedule; their median is its step time (odd: a measured step)
FINISHED = "nothing is left to train: the study is finished"


@dataclass(frozen=True)
class Probe:
    """One probed schedule, trained as the run trains it (`fuse` copies at once in one fused group, on `threads`
    torch threads): a map's share of the median timed step, and of an evaluation, measured on this machine."""

    label: str
    reuse_map: list[int]
    layer_runs: int
    fuse: int
    threads: int | None  # None: torch's default
    seconds_per_step: float  # the median fused step over `fuse`: what one map's step costs the run
    seconds_per_eval: float  # one map's evaluation of the space's eval_windows
    step_seconds: list[float]  # the timed steps of the whole group, in order (of each group side by side, in turn)
    side_by_side: int = 1  # groups trained at once while timed (the run's lanes and workers on a CPU)


def probed_seconds(baseline: Probe, costliest: Probe, layer_runs: float, steps: int, evaluations: int) -> float:
    """Seconds of a proxy run of `steps` steps and `evaluations` evaluations of a map of `layer_runs` layer runs:
    a line through the two probes, never falling (a noisy costliest probe timed below the baseline would otherwise
    price the maps beyond it, the learning run's, below zero)."""
    at = (layer_runs - baseline.layer_runs) / max(1, costliest.layer_runs - baseline.layer_runs)
    step = baseline.seconds_per_step + at * max(0.0, costliest.seconds_per_step - baseline.seconds_per_step)
    evaluation = baseline.seconds_per_eval + at * max(0.0, costliest.seconds_per_eval - baseline.seconds_per_eval)
    return steps * step + evaluations * evaluation


def timed_steps(
    model: ModelConfig, schedules: Sequence[Sequence[int]], data: TokenData, train: TrainConfig
) -> tuple[list[float], list[float], int]:
    """(seconds of each of PROBE_TIMED training steps after PROBE_WARMUP untimed ones, seconds of each evaluation
    after them, validation windows an evaluation read) of `schedules` trained together: one by train_proxy, several
    in one fused group, as the run trains them. Every step is evaluated on one batch, so that each ends in a host
    sync at a known time: a step is timed from the end of the evaluation before it to its own host sync."""
    steps = PROBE_WARMUP + PROBE_TIMED
    cfg = dataclasses.replace(
        train,
        steps=steps,
        compile=False,
        checkpoint_every=0,
        eval_windows=train.batch_size,
        eval_fractions=tuple(s / steps for s in range(1, steps + 1)),
    )
    stepped: dict[int, float] = {}  # step -> when its losses reached the host (its first member's)
    evaluated: dict[int, float] = {}  # step -> when its evaluation ended (its last member's)

    def on_step(step: int, total: int, loss: float) -> None:
        stepped.setdefault(step, time.perf_counter())

    def on_eval(point: Any) -> bool:
        evaluated[point.step] = time.perf_counter()
        return False

    if len(schedules) == 1:
        train_proxy(model, schedules[0], data, cfg, on_eval=on_eval, on_step=on_step)
    else:
        from ilr_search.training.fused import train_fused

        train_fused(model, schedules, data, cfg, on_eval=[on_eval] * len(schedules), on_step=[on_step] * len(schedules))
    timed = [s for s in range(PROBE_WARMUP + 1, steps + 1) if s in stepped and s in evaluated and s - 1 in evaluated]
    if not timed:
        raise RuntimeError(f"the timing probe of {len(schedules)} schedule(s) diverged on random tokens")
    return (
        [stepped[s] - evaluated[s - 1] for s in timed],
        [evaluated[s] - stepped[s] for s in timed],
        len(data.val_starts(cfg.eval_windows, model.seq_len)),
    )


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Torch on `threads` threads (None: as it is) inside, this process's threads set back after."""
    import torch

    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def probe_schedule(
    space: SpaceConfig,
    model: ModelConfig,
    reuse_map: list[int],
    label: str,
    dtype: Dtype,
    data: TokenData,
    fuse: int = 1,
    threads: int | None = None,
    side_by_side: int = 1,
) -> Probe:
    """Time `reuse_map` trained `fuse` at a time on `threads` torch threads (uncompiled), this process's threads
    set back after; with `side_by_side` > 1 that many such groups train at once in threads of this process, as a
    run's lanes and workers share the machine (its cores' caches and memory, and this process's interpreter), and
    every group's steps are timed."""
    schedule = reuse_map_schedule(reuse_map)
    train = dataclasses.replace(space.train, dtype=dtype)
    timed: list[tuple[list[float], list[float], int]] = []
    failures: list[BaseException] = []

    def group() -> None:
        try:
            timed.append(timed_steps(model, [schedule] * fuse, data, train))
        except BaseException as e:  # raised again below
            failures.append(e)

    with torch_threads(threads):
        others = [threading.Thread(target=group, daemon=True) for _ in range(side_by_side - 1)]
        for t in others:
            t.start()
        group()
        for t in others:
            t.join()
    if failures:
        raise failures[0]
    steps = [s for lane_steps, _, _ in timed for s in lane_steps]
    evals = [e for _, lane_evals, _ in timed for e in lane_evals]
    per_window = statistics.median(evals) / max(1, timed[0][2])
    return Probe(
        label,
        reuse_map,
        len(schedule),
        fuse,
        threads,
        statistics.median(steps) / fuse,
        per_window * space.train.eval_windows / fuse,
        steps,
        side_by_side,
    )


@dataclass(frozen=True)
class FixedRace:
    """The fixed race's shape: its contenders trained at every length and seed (fewer where it eliminates)."""

    seeds: int
    lengths: list[int]
    contenders: int


SCREEN_WAVE = RaceSettings.calibration  # maps the adaptive race screens at a time (its calibration)


@dataclass(frozen=True)
class AdaptiveRace:
    """The adaptive race's shape: maps screened at seed 0, contenders tested on the first test seeds and, while
    open, up to max_seeds, and the equal-compute reference."""

    screen: int
    contenders: int
    first_test_seeds: int
    max_seeds: int
    equal_compute: str
    look_every: int = 1  # test seeds a wave after the first test (sequential.looks_apart)


@dataclass(frozen=True)
class RacePlan:
    """What the race would train (race_plan), or has left to train (race_left: steps_trained and decided set):
    its policy (off, fixed or adaptive) and shape, its length, its least and most runs and steps, and its compute
    cap (None: none)."""

    policy: str
    target_steps: int
    runs_min: int
    runs_max: int
    steps_min: int
    steps_max: int
    shape: FixedRace | AdaptiveRace | None = None  # None: the race is off
    cap: int | None = None
    steps_trained: int | None = None  # with decided: what the stored race has trained
    decided: bool | None = None
    frozen: bool = False  # runs are evaluations of a chunk each (no step)

    def to_dict(self) -> dict[str, Any]:
        report: dict[str, Any] = {"policy": self.policy, "target_steps": self.target_steps}
        if self.shape is not None:
            report |= dataclasses.asdict(self.shape)
        report |= {
            "runs_min": self.runs_min,
            "runs_max": self.runs_max,
            "steps_min": self.steps_min,
            "steps_max": self.steps_max,
        }
        if self.shape is not None:
            report["cap"] = self.cap
        if self.steps_trained is not None:
            report |= {"steps_trained": self.steps_trained, "decided": self.decided}
        return report | ({"frozen": True} if self.frozen else {})


@dataclass(frozen=True)
class PlanBudget:
    text: str
    ratio: float
    max_layer_runs: int


@dataclass(frozen=True)
class PlanModel:
    """The model's shape as the dry run lists it (its keys are the words the plan prints)."""

    layers: int
    d_model: int
    heads: int
    seq_len: int
    pe: str
    vocab_size: int


@dataclass(frozen=True)
class PlanData:
    corpus: str
    tokenizer: str
    tokens_cached: bool | None  # None: a hub corpus, not cached here


@dataclass(frozen=True)
class PlanTrain:
    steps: int
    batch_size: int
    lr: float
    eval_steps: list[int]
    device: str
    dtype: str
    compile: bool


@dataclass(frozen=True)
class Estimate:
    """The time left (estimate): the two probes and their FLOPs ratios, the layout probed, and the seconds per
    trial, for the references, for the race (least, most) and in all (least, most), with how they were found."""

    probes: tuple[Probe, Probe]  # the baseline and the costliest map
    probe_flops_ratios: tuple[float, float]
    layout: str
    trial_seconds: float
    reference_seconds: float
    race_seconds: tuple[float, float]
    seconds: float
    seconds_max: float
    note: str
    learn_seconds: float = 0.0  # `run --learn`'s learning run, in seconds and in both totals

    def to_dict(self) -> dict[str, Any]:
        return record_json(self, ESTIMATE_KEYS)


# Estimate's fields under their --json keys (in field order)
ESTIMATE_KEYS = {"probes": "probe", "note": "estimate_note"} | {
    name: f"estimated_{name}"
    for name in ("trial_seconds", "reference_seconds", "race_seconds", "seconds", "seconds_max", "learn_seconds")
}


@dataclass(frozen=True)
class PlanTimeBudget:
    """The run's time budget (`--time-budget`, `[search] time_budget`) against the estimate: its seconds and words,
    and whether the estimate fits in it (`fits`: "yes" where even the most does, "maybe" where only the least
    does, "no" where not even the least does; None where nothing was estimated), said in `line`."""

    seconds: float
    text: str
    fits: str | None
    line: str


def plan_time_budget(seconds: float, estimate: Estimate | None, finished: bool) -> PlanTimeBudget:
    """How the estimate (None: not probed, or nothing left) stands against a budget of `seconds`."""
    text = format_duration(seconds)
    if estimate is None:
        line = "nothing is left to train" if finished else "not compared: no estimate was made"
        return PlanTimeBudget(seconds, text, None, line)
    span = " to ".join(dict.fromkeys(format_duration(s) for s in (estimate.seconds, estimate.seconds_max)))
    stops = "the run stops when it is spent, undecided, and the same command continues"
    fits = "yes" if estimate.seconds_max <= seconds else "maybe" if estimate.seconds <= seconds else "no"
    line = {
        "yes": f"the estimate ({span}) fits within it",
        "maybe": f"the estimate ({span}) may exceed it: where the race needs its most runs, {stops}",
        "no": f"the estimate ({span}) exceeds it: {stops}",
    }[fits]
    return PlanTimeBudget(seconds, text, fits, line)


@dataclass(frozen=True)
class PlanLearn:
    """`run --learn`'s learning run: one gated model at the widest schedule (`layer_runs`: every layer max_reuse
    times) for `steps` steps (a frozen study's gate steps: its weights fixed); `learned`: the study holds its learned
    map already, so nothing is learned again."""

    layer_runs: int
    steps: int
    frozen: bool
    learned: bool


@dataclass(frozen=True)
class DryRunReport:
    """`run --dry-run`: the study and what is left of it (`left`: FINISHED in words once nothing is), its trials
    and references, sampler, pruner, objective, budget, storage, space, model, data, training settings, knobs,
    workers, race, and the time estimate where something is left and it was probed. to_json is its --json."""

    study: str
    resume: bool
    finished: bool
    left: str | None
    n_trials: int
    finished_trials: int
    trials_to_train: int
    references: list[str]
    references_to_train: list[str]
    sampler: str
    pruner: str
    pruning_rungs: list[int]
    objective: str
    budget: PlanBudget
    storage: str
    storage_exists: bool
    space: str
    model: PlanModel
    data: PlanData
    train: PlanTrain
    knobs: list[str]
    workers: int
    race: RacePlan
    parts: list[str] = dataclasses.field(default_factory=lambda: ["both"])  # the parts of a layer searched
    learn: PlanLearn | None = None  # `run --learn`'s learning run (None: no --learn)
    chunk_size: int = 0  # a frozen study's windows or items a chunk (its eval_windows; listed for a frozen one)
    time_budget: PlanTimeBudget | None = None  # the run's wall-clock budget against the estimate (None: none)
    estimate: Estimate | None = None  # under its own keys (Estimate.to_dict), after the plan's

    def to_json(self) -> dict[str, Any]:
        omit = ("estimate",) if self.train.steps == 0 else ("estimate", "chunk_size")
        report = {"dry_run": True} | record_json(self, omit=omit)
        return report | (self.estimate.to_dict() if self.estimate is not None else {})


def probed_maps(space: SpaceConfig, plan: StudyPlan) -> tuple[tuple[str, list[int]], tuple[str, list[int]]]:
    """The two maps the estimate probes, by label: the baseline, and the costliest, the deepest map the budget pays
    for (every layer at max_reuse, repaired to the budget)."""
    n_layers = plan.model.n_layers
    costliest = repair_to_budget([space.search.max_reuse] * n_layers, plan.budget.max_layer_runs(plan.model))
    return ("baseline", [1] * n_layers), ("costliest", costliest)


def dry_run_report(request: RunRequest, probe: bool = True) -> DryRunReport:
    """The `run --dry-run` report: what `request` would do, what is left of it where the study exists (nothing, in
    words, when it is finished), and how long that would take without pruning or a map trained twice, on the layout
    the request's fuse and workers give (as `run` chooses it). Bad input raises as `run` would; nothing is
    written."""
    opened = open_request(request)
    spec, space, plan, study = opened.spec, opened.space, opened.plan, opened.study
    finished = sum(t.has_result for t in opened.trials)
    n_trials = first_trials(opened, request.trials_wanted, enqueue_texts(request, space)).n_trials
    trials_to_train = max(0, n_trials - finished)
    learn = None
    if request.learn:
        from ilr_search.search.learn import LEARNED_ATTR
        from ilr_search.training.learned import FROZEN_STEPS

        learned = study is not None and LEARNED_ATTR in study.user_attrs
        steps = space.train.steps or FROZEN_STEPS
        learn = PlanLearn(plan.model.n_layers * space.search.max_reuse, steps, space.train.steps == 0, learned)
        if not learned and request.trials_wanted == 0:  # --n-trials 0: the learned map beside the plain model
            n_trials, trials_to_train = n_trials + 1, trials_to_train + 1
    refs = reference_runs(plan, opened.trials)
    names = [r.name for r in refs] + (
        ["second_seed"] if space.search.second_seed_reference and not any(r.name == "second_seed" for r in refs) else []
    )  # the best recurrent map at a second seed, once known
    stored = study_references(spec, study) if study is not None else {}
    refs_to_train = [n for n in names if n not in stored]
    race = race_plan(plan, n_trials)
    if study is not None and race.runs_max:
        race = race_left(race, opened, study, trials_to_train)
    left = trials_to_train > 0 or bool(refs_to_train) or race.runs_max > 0 or (learn is not None and not learn.learned)
    model, train = plan.model, space.train
    device = resolve_device(train.device)
    compiled = resolve_compile(train.compile, device)
    cache = cache_root() / f"tokens-{cache_key(space.data, space.data.max_train_tokens)}"
    estimated = None
    if probe and left:
        layout = resolve_layout(plan, request.asked_fuse, request.workers, n_trials).layout
        if space.train.steps == 0:
            estimated = frozen_estimate(space, plan, trials_to_train, layout, race)
        else:
            estimated = estimate(space, plan, refs, trials_to_train, refs_to_train, layout, race, learn)
    return DryRunReport(
        study=plan.name,
        resume=study is not None,
        finished=not left,
        left=FINISHED if not left else None,
        n_trials=n_trials,
        finished_trials=finished,
        trials_to_train=trials_to_train,
        references=names,
        references_to_train=refs_to_train,
        sampler=sampler_settings(space.search.sampler, space.train.seed, space.search.max_reuse).name,
        pruner=space.search.pruner,
        pruning_rungs=list(pruner_settings(space).rungs) if space.search.pruner != "none" else [],
        objective=space.search.objective,
        budget=PlanBudget(plan.budget.text, plan.budget.ratio, plan.budget.max_layer_runs(model)),
        storage=spec.masked,
        storage_exists=spec.exists(),
        space=space.source,
        model=PlanModel(model.n_layers, model.d_model, model.n_heads, model.seq_len, model.pe, model.vocab_size),
        data=PlanData(
            space.data.corpus,
            space.data.tokenizer,
            (cache / "meta.json").exists() if not space.data.corpus.startswith("hf:") else None,
        ),
        train=PlanTrain(train.steps, train.batch_size, train.lr, train.eval_steps, str(device), plan.dtype, compiled),
        knobs=list(space.search.knobs),
        parts=list(space.search.parts),
        workers=request.workers or 1,
        race=race,
        estimate=estimated,
        chunk_size=space.train.eval_windows,
        time_budget=None if request.time_budget is None else plan_time_budget(request.time_budget, estimated, not left),
        learn=learn,
    )


def race_left(race: RacePlan, opened: OpenedStudy, study: Any, trials_to_train: int) -> RacePlan:
    """`race` (race_plan's) less what the stored study's race has stored: nothing once its trials are all done and
    the policy has decided (under this run's compute cap), else its runs and steps less those trained."""
    store = open_store(opened.spec, opened.plan.name, read_only=True, storage=opened.storage)
    _, results, state = study_race(study.user_attrs, store.runs(), opened.plan.space.search.max_race_steps)
    trained = sum(r.steps for r in results if r.kind == "race")
    if trials_to_train == 0 and state.done:
        return dataclasses.replace(
            race, runs_min=0, runs_max=0, steps_min=0, steps_max=0, steps_trained=trained, decided=True
        )
    if race.frozen:  # runs are evaluations: what is left is counted in runs
        done = sum(1 for r in results if r.kind == "race")
        return dataclasses.replace(
            race,
            runs_min=max(0, race.runs_min - done),
            runs_max=max(len(state.next_jobs), race.runs_max - done),
            steps_trained=0,
            decided=False,
        )
    target = race.target_steps
    steps_min = max(0, race.steps_min - trained)
    steps_max = max(steps_min, race.steps_max - trained, sum(j.steps for j in state.next_jobs))
    return dataclasses.replace(
        race,
        runs_min=math.ceil(steps_min / target),
        runs_max=math.ceil(steps_max / target),
        steps_min=steps_min,
        steps_max=steps_max,
        steps_trained=trained,
        decided=False,
    )


def race_plan(plan: StudyPlan, n_trials: int) -> RacePlan:
    """What the race would train, in runs at the target length: at least (every run a decided race needs: the
    screen, the contenders' first test seeds, the equal-compute reference at those seeds) and at most (every
    contender to the pool's last seed), both within the compute cap; the fixed race trains its contenders at every
    length and seed, fewer where it eliminates."""
    search, base = plan.space.search, plan.space.train.steps
    target = race_target_steps(search.target, base)
    if not races(base, target, search.race_seeds):
        return RacePlan("off", target, 0, 0, 0, 0)
    screened = min(search.race_screen, n_trials)  # the adaptive race's
    contenders = min(search.race_contenders, screened)  # the plain model among them
    if base == 0:  # frozen: the trials' chunk 0 screens; the contenders and the plain model evaluate test chunks
        first, most = search.race_seeds - 1, search.max_seeds - 1
        return RacePlan(
            "adaptive",
            0,
            runs_min=contenders * first,
            runs_max=contenders * most,
            steps_min=0,
            steps_max=0,
            shape=AdaptiveRace(screened, contenders, first, search.max_seeds, "off"),
            frozen=True,
        )
    if search.race_policy == "fixed":
        lengths = list(race_lengths(RaceSettings(base, target)))  # doubled from the proxy's up to the target
        per_map = sum(lengths) * search.race_seeds - base
        most = search.race_contenders * per_map
        return RacePlan(
            "fixed",
            target,
            runs_min=0,
            runs_max=search.race_contenders * (len(lengths) * search.race_seeds - 1),
            steps_min=0,
            steps_max=most,
            shape=FixedRace(search.race_seeds, lengths, search.race_contenders),
            cap=search.max_race_steps or None,
        )
    deep = 1 if search.equal_compute == "depth" else 0
    first = screened + contenders * (search.race_seeds - 1) + deep * search.race_seeds
    most = screened + contenders * (search.max_seeds - 1) + deep * search.max_seeds
    cap = search.max_race_steps or None
    steps_min, steps_max = first * target, most * target
    if cap is not None:
        steps_min, steps_max = min(steps_min, cap), min(steps_max, cap)
    return RacePlan(
        "adaptive",
        target,
        runs_min=steps_min // target,
        runs_max=steps_max // target,
        steps_min=steps_min,
        steps_max=steps_max,
        shape=AdaptiveRace(
            screened,
            contenders,
            search.race_seeds - 1,
            search.max_seeds,
            search.equal_compute,
            looks_apart(search.look_every, search.max_seeds - 1),
        ),
        cap=cap,
    )


def race_waves(shape: AdaptiveRace, least: bool) -> list[list[str]]:
    """The adaptive race's waves in its least or most outcome, each a list of runs in the policy's order (the
    baseline first): "plain" (the baseline), "map" (a recurrent contender) or "deep" (the equal-compute model). The
    screen asks SCREEN_WAVE maps at a time (adaptive_race's calibration), the first test every contender's first
    test seeds at once, each later wave `look_every` seeds more (the most: to the pool's last), and the
    equal-compute model comes last, at the best contender's seeds."""
    screen = ["plain"] + ["map"] * (shape.screen - 1)
    waves = [screen[i : i + SCREEN_WAVE] for i in range(0, len(screen), SCREEN_WAVE)]
    waves.append(["plain"] * shape.first_test_seeds + ["map"] * ((shape.contenders - 1) * shape.first_test_seeds))
    seeds = shape.first_test_seeds + 1  # seed 0 screened
    if not least:
        while seeds < shape.max_seeds:
            n = min(shape.look_every, shape.max_seeds - seeds)
            waves.append(["plain"] * n + ["map"] * ((shape.contenders - 1) * n))
            seeds += n
    if shape.equal_compute == "depth":
        waves.append(["deep"] * seeds)
    return [w for w in waves if w]


def wave_seconds(runs: Sequence[float], processes: int, fuse: int) -> float:
    """A wave's wall seconds as the race's workers share it (search/race.run_race): groups of up to
    min(fuse, ceil(runs / processes)) runs in order, each group to the worker free first; a group costs the sum of
    its runs' seconds, each priced as a member of a probed fused group."""
    limit = max(1, min(fuse, -(-len(runs) // max(1, processes))))
    loads = [0.0] * max(1, processes)
    for i in range(0, len(runs), limit):
        loads[loads.index(min(loads))] += sum(runs[i : i + limit])
    return max(loads)


def race_seconds(
    race: RacePlan,
    run_seconds: Callable[[float], float],
    plain: float,
    mid: float,
    most: float,
    processes: int = 1,
    fuse: int = 1,
) -> tuple[float, float]:
    """The race's (least, most) wall seconds on `processes` race workers fusing up to `fuse` runs, each run at its
    own cost (`run_seconds` of a target-length run of so many layer runs). An adaptive race's least: its least
    waves (race_waves), recurrent runs and the equal-compute model at an average map's cost (`mid` layer runs), the
    baseline at `plain`; its most: its most waves, every recurrent run and the equal-compute model as deep as the
    best contender at the budget's most (`most`); a wave lasts as long as its busiest worker (wave_seconds); both
    scaled to the steps `race` has (race_left's are what is left; the compute cap). A fixed race: every run at
    `mid`, shared evenly."""
    shape = race.shape
    if not isinstance(shape, AdaptiveRace) or not race.target_steps:
        runs = (race.steps_min / race.target_steps, race.steps_max / race.target_steps) if race.target_steps else (0, 0)
        return runs[0] * run_seconds(mid) / processes, runs[1] * run_seconds(mid) / processes

    def waves_seconds(least: bool, depth: float) -> tuple[float, int]:
        price = {"plain": run_seconds(plain), "map": run_seconds(depth), "deep": run_seconds(depth)}
        waves = race_waves(shape, least)
        seconds = sum(wave_seconds([price[run] for run in wave], processes, fuse) for wave in waves)
        return seconds, sum(len(wave) for wave in waves)

    (least, least_runs), (most_seconds, most_runs) = waves_seconds(True, mid), waves_seconds(False, most)
    return (
        least * race.steps_min / (least_runs * race.target_steps),
        most_seconds * race.steps_max / (most_runs * race.target_steps),
    )


def estimate(
    space: SpaceConfig,
    plan: StudyPlan,
    refs: list[ReferenceRun],
    trials_to_train: int,
    refs_to_train: list[str],
    layout: Layout,
    race: RacePlan,
    learn: PlanLearn | None = None,
) -> Estimate:
    """The time left, as one range: time per map as a line through the probed cheapest and costliest schedules
    (per layer run, each probed as the run trains it: `layout`'s fused group size and threads), applied to an
    average sampled map (half-way), each reference, each evaluation and each race run; the range is the race's
    least and most runs (on a CPU of several cores the race's runs share them, one process a core)."""
    fuse = layout.fuse if fusable(plan.model) else 1
    threads = layout.threads if layout.threads is not None else process_threads(space, layout.groups)
    lane_fuse = -(-fuse // layout.lanes)  # each lane trains its share of a group, side by side
    data = random_tokens(plan.model.vocab_size, plan.model.seq_len)
    # on a CPU the run's lanes (or its race's processes) train side by side: the probes too
    side = (
        min(usable_cores(), max(layout.groups * layout.lanes, race_processes(space, layout.groups)))
        if on_cpu(space)
        else 1
    )
    baseline, costliest = (
        probe_schedule(space, plan.model, counts, label, plan.dtype, data, lane_fuse, threads, max(1, side))
        for label, counts in probed_maps(space, plan)
    )

    def proxy_seconds(layer_runs: float) -> float:
        return probed_seconds(baseline, costliest, layer_runs, space.train.steps, len(space.train.eval_steps))

    groups = layout.groups
    mid_runs = (baseline.layer_runs + costliest.layer_runs) / 2
    costly_runs = float(costliest.layer_runs)

    def target_run(layer_runs: float) -> float:
        return proxy_seconds(layer_runs) * race.target_steps / space.train.steps

    trial_seconds = proxy_seconds(mid_runs)
    schedules = {r.name: r.schedule for r in refs}  # second_seed's map is known once the trials are: an average one
    ref_seconds = sum(proxy_seconds(mid_runs if n == "second_seed" else len(schedules[n])) for n in refs_to_train)
    racers = max(groups, race_processes(space, groups))
    race_min, race_max = (
        race_seconds(race, target_run, baseline.layer_runs, mid_runs, costly_runs, racers, fuse)
        if race.runs_max
        else (0.0, 0.0)
    )
    total = (trials_to_train * trial_seconds + ref_seconds) / (groups * layout.lanes)
    # one gated model at the widest schedule, alone, before the trials (its layer runs beyond the probes': a line)
    learn_seconds = (
        proxy_seconds(learn.layer_runs) * learn.steps / space.train.steps
        if learn is not None and not learn.learned
        else 0.0
    )
    total += learn_seconds
    return Estimate(
        (baseline, costliest),
        (
            flops_ratio(plan.model, reuse_map_schedule(baseline.reuse_map)),
            flops_ratio(plan.model, reuse_map_schedule(costliest.reuse_map)),
        ),
        describe(Layout(groups, fuse, threads, layout.lanes)),
        trial_seconds,
        ref_seconds,
        (race_min, race_max),
        total + race_min,
        total + race_max,
        f"from the median of {PROBE_TIMED} timed steps after {PROBE_WARMUP} untimed ones, "
        "trained as the run trains them"
        + (f" ({side} groups side by side, as its lanes and workers share the CPU)" if side > 1 else "")
        + "; no pruning and no repeated map assumed (both shorten a run); an average trial is taken half-way between "
        "the baseline and the costliest map; the race's most prices every recurrent run and the equal-compute model "
        "at the costliest map's depth, and each of its waves as long as its busiest worker; start-up, storage writes, "
        "tokenizing an uncached corpus, layer compilation and a changing machine load are not counted"
        + (
            f"; {groups} workers are assumed to share the device without slowing each other"
            if groups > 1 and side == 1
            else ""
        ),
        learn_seconds,
    )


def frozen_estimate(
    space: SpaceConfig, plan: StudyPlan, trials_to_evaluate: int, layout: Layout, race: RacePlan
) -> Estimate:
    """A frozen study's time left: an evaluation of the plain model and of the costliest map (each one chunk of
    eval_windows windows of random tokens, the checkpoint's weights in the study's dtype, on the run's threads),
    timed after one untimed, and a line through them by layer runs for an average map (half-way); the trials
    evaluate chunk 0, the race its least and most runs, on the race's processes."""
    from ilr_search.training.build import build_model
    from ilr_search.training.frozen import FrozenEvaluator

    model_cfg = plan.model
    threads = layout.threads if layout.threads is not None else process_threads(space, layout.groups)
    data = random_tokens(model_cfg.vocab_size, model_cfg.seq_len)
    n = min(space.train.eval_windows, data.window_chunks(1, model_cfg.seq_len))
    cfg = dataclasses.replace(space.train, dtype=plan.dtype)
    device = resolve_device(cfg.device)
    with torch_threads(threads):
        evaluator = FrozenEvaluator(build_model(model_cfg, 0).to(device), data, plan.dtype, cfg.batch_size, 0)
        timings = []
        for label, counts in probed_maps(space, plan):
            schedule = reuse_map_schedule(counts)
            evaluator.evaluate(model_cfg, schedule, 0, n, share=False)  # untimed: memory, kernels
            t0 = time.perf_counter()
            evaluator.evaluate(model_cfg, schedule, 0, n, share=False)
            seconds = (time.perf_counter() - t0) * space.train.eval_windows / n
            timings.append(Probe(label, counts, len(schedule), 1, threads, 0.0, seconds, []))
    baseline, costliest = timings
    mid = (baseline.seconds_per_eval + costliest.seconds_per_eval) / 2
    racers = max(layout.groups, race_processes(space, layout.groups))
    race_min, race_max = race.runs_min * mid / racers, race.runs_max * mid / racers
    trials = trials_to_evaluate * mid
    return Estimate(
        (baseline, costliest),
        (
            flops_ratio(model_cfg, reuse_map_schedule(baseline.reuse_map)),
            flops_ratio(model_cfg, reuse_map_schedule(costliest.reuse_map)),
        ),
        describe(Layout(layout.groups, 1, threads, 1)),
        mid,
        0.0,
        (race_min, race_max),
        trials + race_min,
        trials + race_max,
        f"from one timed evaluation of {space.train.eval_windows} windows after an untimed one, of the plain model "
        "and of the costliest map, each a full forward pass (a map that begins as the plain model starts later "
        "in a run: shorter); an average map half-way between them; loading the checkpoint and its data, and "
        "storage writes, are not counted",
    )
