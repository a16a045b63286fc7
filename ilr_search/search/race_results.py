"""The race as the storage holds it: its settings from the study's configuration, every stored result read as one
(map, steps, seed) evaluation (the trials' results at the proxy's length and the space's seed, the reference runs,
and the race runs: the race's and the audit's), the policy's state over them (racing.py), and what it decided: the
race's report, the one-line answer, the decided front. Pure readings: nothing is trained here (race.py trains)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from ilr_search.analysis.answer import Answer, Trust, judge_answer, race_answer, unraced_answer
from ilr_search.analysis.race_core import EqualCompute, Judged, race_result, run_evaluation
from ilr_search.analysis.race_report import DecidedBest, RaceReport
from ilr_search.analysis.racing import FrontPoint, RaceJob, RaceSettings, RaceState, race_state
from ilr_search.analysis.results import (
    FrontRow,
    knobs_text,
    study_front,
    trained_by_map,
)
from ilr_search.config import (
    ITEM_OBJECTIVES,
    ModelConfig,
    SpaceConfig,
    TrainConfig,
    factor_key,
    race_target_steps,
    scored_by_item,
)
from ilr_search.search.plan import CONFIG_ATTR, OPTIONAL_TRAIN_FIELDS
from ilr_search.storage import Run, RunJob
from ilr_search.storage.store import study_ledger
from ilr_search.storage.trials import TrialRecord
from ilr_search.training.flops import param_count
from ilr_search.training.schedule import Map, is_baseline_key, map_text

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
    items = scored_by_item(search.objective, base_steps)
    judged: Judged = (
        "accuracy" if search.objective in ITEM_OBJECTIVES else "answer" if search.objective == "answer" else "ppl"
    )
    race = RaceSettings(
        base_steps,
        race_target_steps(search.target, base_steps),
        tuple(seed + i for i in range(search.race_seeds if fixed else search.max_seeds)),
        race_contenders=search.race_contenders,
        policy="fixed" if fixed else "adaptive",
        max_steps=max_steps or None,
        judged=judged,
        items=items,
        two_sided=search.judge,
        # a study of blocks, and a judge (whose candidates on a deep model are blocks), write a map that repeats one
        # layer as the block of that layer, block:I-I:R
        blocks="ilr" not in search.families or search.judge,
        margin=CLAIM_MARGIN_NATS if base_steps == 0 and search.objective not in ITEM_OBJECTIVES else 0.0,
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
        **{k: train[k] for k in (*OPTIONAL_TRAIN_FIELDS, "warmup_frac", "min_lr_frac") if k in train}
    ).lr_schedule_text()


def race_run_job(job: RaceJob, base_steps: int) -> RunJob:
    return RunJob(factor_key(job.steps / base_steps if base_steps else 0), job.seed, job.map_key)


def stored_results(rows: Sequence[Run]) -> list[Run]:
    """Every finished result of the study's ledger (study_ledger), one per (map, steps, seed), as the race reads it
    (race_result): the trials' at the proxy's length (complete or diverged; a pruned trial has no result at a
    length the race knows), the reference runs of reuse maps, and the race runs; the first run of a (map, steps,
    seed) wins, in that order. `rows`: the store's runs (Store.runs)."""
    unique: dict[tuple[str, int, int], Run] = {}
    for run in study_ledger(rows):
        if run.finished and (run.kind != "reference" or run.reuse_map):  # block recurrence is no reuse map
            unique.setdefault((run.map_key, run.steps, run.seed), race_result(run))
    return list(unique.values())


def study_race(
    study_attrs: Mapping[str, Any], rows: Sequence[Run], max_steps: int | None = None
) -> tuple[RaceSettings, list[Run], RaceState]:
    """The race's settings, the study's results, and the policy's decision on them. The policy sees the maps
    a trial trained to the proxy's length (and the baseline), and the equal-compute models (deepR): a pruned
    map that the audit retrained is no contender, and the race does not train it to the proxy's length to make it
    one. The compute cap: `max_steps`, or the one the study's last run raced under."""
    config = study_attrs[CONFIG_ATTR]
    settings = race_settings(config, max_steps if max_steps is not None else study_attrs.get(RACE_CAP_ATTR))
    results = stored_results(rows)
    baseline = Map.baseline(int(config["model"]["n_layers"])).key
    raced = {r.map_key for r in results if r.kind == "trial"} | {baseline}
    evaluations = [run_evaluation(r) for r in results if r.map_key in raced or Map.form_of(r.map_key) == "deeper"]
    return settings, results, race_state(evaluations, settings, baseline)


def deep_model(model: ModelConfig, key: str) -> ModelConfig:
    """The equal-compute model deepR: the study's model (its knobs off) with R layers, each run once."""
    return dataclasses.replace(model, n_layers=layer_runs_of_deep(key))


def layer_runs_of_deep(key: str) -> int:
    return Map.parse(key).n_layers


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


def proxy_points(trials: Sequence[TrialRecord], settings: RaceSettings) -> tuple[FrontPoint, ...]:
    """The proxy's front (study_front) as front points: the proxy's length, the space's seed, no interval, not
    confirmed."""
    keys = {r.number: r.map_key for r in trials if r.map_key is not None}  # the front's trials all have theirs
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
        for p in study_front(trials)
    )


def front_rows(points: Sequence[FrontPoint], trials: Sequence[TrialRecord], results: Sequence[Run]) -> list[FrontRow]:
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
                reuse_map=t.reuse_map if t is not None else Map.parse(p.map_key).counts,
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


def race_report(
    trials: Sequence[TrialRecord], study_attrs: Mapping[str, Any], rows: Sequence[Run]
) -> RaceReport | None:
    """What `run`, `pareto`, `trials` and `studies` report of the race (analysis/race_report.py): its settings, every
    stored result, the policy's state, the decided front, the equal-compute comparison and the answer; None for a
    study not made by ilr-search (it has no race)."""
    if CONFIG_ATTR not in study_attrs:
        return None
    settings, results, state = study_race(study_attrs, rows)
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
        lr_schedule(study_attrs[CONFIG_ATTR]),
    )


def foreign_answer(trials: Sequence[TrialRecord]) -> Answer:
    """The answer of a study not made by ilr-search: it has no race."""
    steps = max((t.steps for t in trials), default=0)
    return unraced_answer("the study was not made by ilr-search (no race)", steps)


def study_answer(
    study_attrs: Mapping[str, Any], settings: RaceSettings, results: Sequence[Run], state: RaceState
) -> Answer:
    """The study's answer line and details (analysis/answer.py): the race's, with the plain model's mean perplexity
    at the race's length and the screen's proxy-to-target rank agreement; where the race trains nothing, that no map
    was tested."""
    if not settings.races:
        return unraced_answer(
            f"the race is off (one {settings.words.unit} at the proxy's length, no test)", settings.base_steps
        )
    steps = state.level_steps or settings.target_steps
    baseline = Map.baseline(int(study_attrs[CONFIG_ATTR]["model"]["n_layers"])).key
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
    return race_answer(state, settings, baseline, baseline_ppl, trust)


def judged_model(config: Mapping[str, Any]) -> str:
    """The model a judge study judges, as its answer names it: its checkpoint's file or folder name."""
    source = str(config.get("init", {}).get("source") or SpaceConfig.from_dict(config).model.init or "the model")
    return source[3:] if source.startswith("hf:") else Path(source).name


def decided_points(trials: Sequence[TrialRecord], settings: RaceSettings, state: RaceState) -> tuple[FrontPoint, ...]:
    """The front the study decided: the race's (each point at its raced length, with its seeds and interval)
    where the study races and the race has a front; the proxy's otherwise (the race off, or before it has its
    contenders: base results missing)."""
    return state.front if settings.races and state.front else proxy_points(trials, settings)


def decided_front(trials: Sequence[TrialRecord], race: RaceReport | None) -> list[FrontRow]:
    """The decided front as rows: the race's (decided_points); for a study not made by ilr-search, which has no
    race, the proxy's front (study_front). What the figure's layer heatmap, `pareto --view layers` and the default
    map of `recipe` and `train --from-study` read."""
    return list(race.front) if race is not None else study_front(trials)


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
