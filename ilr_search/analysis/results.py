"""Reading a study's trials back: rows, which trials stand for their map, the front, reference runs."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from ilr_search.analysis.map_key import MapKey, map_text
from ilr_search.analysis.pareto import pareto_front
from ilr_search.analysis.trials import Trial, TrialRecord, record_of, trained_results, trial_records
from ilr_search.config import SpaceConfig
from ilr_search.knobs import format_knobs
from ilr_search.storage import CurvePoint, RaceRun, Store, TrainCurvePoint
from ilr_search.training.schedule import is_block_text

REFERENCE_PREFIX = "ilr:reference:"


def as_list(ints: tuple[int, ...] | None) -> list[int] | None:
    """A record's map as the lists rows and JSON show."""
    return list(ints) if ints is not None else None


def knobs_text(r: TrialRecord) -> str | None:
    """A trial's knobs as rows show them (`injection=add`), None where none is set."""
    return format_knobs(r.knobs) if r.knobs else None


def trial_row(t: Trial) -> dict[str, Any]:
    """One trial as the `trials` command shows it."""
    r = record_of(t)
    return {
        "trial": r.number,
        "state": r.state.name,
        "reuse_map": as_list(r.reuse_map),
        "map": map_text(r.map_key) if r.map_key else None,
        "knobs": knobs_text(r),
        "flops_ratio": r.flops_ratio,
        "val_ppl": r.val_ppl,
        "val_bpb": r.val_bpb,
        "steps": r.steps,
        "pruned_at_step": r.pruned_at_step,
        "reused_from": r.reused_from,
        "proposed_map": as_list(r.proposed_map),
        "reason": r.reason,
        "seconds": r.seconds,
    }


Curves = dict[int, dict[int, float]]  # trial number -> {step: val_loss}, from the store (the one place curves live)


def curves_by_trial(points: Iterable[CurvePoint]) -> Curves:
    curves: Curves = {}
    for p in points:
        curves.setdefault(p.trial_number, {})[p.step] = p.val_loss
    return curves


def curve_of(t: Trial, curves: Curves) -> dict[int, float]:
    """A trial's learning curve; a trial that reused another's result has that trial's curve."""
    r = record_of(t)
    return curves.get(r.number) or (curves.get(r.reused_from, {}) if r.reused_from is not None else {})


@dataclass(frozen=True)
class CurveRow:
    """One point of a learning curve in the long table of `export --curves`: a trial's (or a reference run's, or a
    race run's) validation loss (kind "val") or training-loss window mean (kind "train") at `step`. A race run's
    points carry its map key in `map`, its `seed` and its length `run_steps` (what names it in the trials table)."""

    trial: int | None  # None: a reference run or a race run
    reference: str | None
    map: str
    kind: str  # val | train
    step: int
    tokens: int
    loss: float
    seed: int | None = None  # a race run's
    run_steps: int | None = None  # a race run's length (steps in the trials table)


def curve_rows(study: optuna.Study, store: Store) -> list[CurveRow]:
    """Every stored curve point of the study's trials (those that trained: a trial that reused a result has
    none of its own), validation then training points of each trial, then the reference runs' and the race
    runs' validation curves (their tokens from the study's batch shape)."""
    rows: list[CurveRow] = []
    val = sorted(store.curve_points(), key=lambda p: (p.trial_number, p.step))
    train = store.train_curve_points()
    by_trial: dict[int, list[CurveRow]] = {}
    for p in val:
        by_trial.setdefault(p.trial_number, []).append(
            CurveRow(p.trial_number, None, p.map_key, "val", p.step, p.tokens, p.val_loss)
        )
    for q in train:
        by_trial.setdefault(q.trial_number, []).append(
            CurveRow(q.trial_number, None, q.map_key, "train", q.step, q.tokens, q.loss)
        )
    for number in sorted(by_trial):
        rows += by_trial[number]
    per_step = tokens_per_step(study.user_attrs)
    for name, ref in sorted(references(study).items()):
        label = ",".join(map(str, ref["reuse_map"])) if ref.get("reuse_map") else name
        rows += [
            CurveRow(None, name, label, "val", int(step), int(step) * per_step, float(loss))
            for step, loss in ref.get("curve", [])
        ]
    for run in race_run_rows(store.race_runs(), study.user_attrs):
        rows += [
            CurveRow(None, None, run["map_key"], kind, p["step"], p["tokens"], p["loss"], run["seed"], run["steps"])
            for kind in ("val", "train")
            for p in run["curves"][kind]
        ]
    return rows


def tokens_per_step(study_attrs: Mapping[str, Any]) -> int:
    """Training tokens a step of the study's runs sees (0 for a study not made by ilr-search): what puts tokens
    on the curves of runs that stored only steps (the reference and race runs)."""
    config = study_attrs.get("ilr:config")  # search/plan.py's CONFIG_ATTR (analysis sits below search)
    if config is None:
        return 0
    space = SpaceConfig.from_dict(config)
    return space.train.batch_size * space.train.grad_accum * space.model.seq_len


def race_run_rows(runs: Sequence[RaceRun], study_attrs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every stored race run (the race's and the audit's runs beyond the trials, whatever their state) as a row of
    `trials --json`: its map (key, reuse map, knobs; an equal-compute reference deepR has no reuse map), factor,
    length, seed, state (running | complete | failed: diverged | interrupted), FLOPs, result, and curves in the
    trials' shape (validation points; the race stores no training curve, so `train` is empty)."""
    per_step = tokens_per_step(study_attrs)
    config = study_attrs.get("ilr:config")  # search/plan.py's CONFIG_ATTR
    n_layers = int(config["model"]["n_layers"]) if config else None
    rows = []
    for r in runs:
        key = r.job.map_key
        deep = is_deep_key(key)
        parsed = None if deep else MapKey.parse(key, n_layers)
        rows.append(
            {
                "map_key": key,
                "reuse_map": list(parsed.map.counts) if parsed else None,
                "knobs": parsed.knobs or None if parsed else None,
                "factor": r.job.factor,
                "steps": r.steps,
                "seed": r.job.seed,
                "state": r.state,
                "flops_ratio": r.flops_ratio,
                "val_loss": r.val_loss,
                "val_ppl": r.val_ppl,
                "val_bpb": r.val_bpb,
                "seconds": r.seconds,
                "reason": r.reason,
                "curves": {
                    "val": [{"step": step, "tokens": step * per_step, "loss": loss} for step, loss in r.curve],
                    "train": [],
                },
            }
        )
    return rows


def curves_of_trials(
    trials: Sequence[Trial], val: list[CurvePoint], train: list[TrainCurvePoint]
) -> dict[int, dict[str, list[dict[str, float]]]]:
    """Trial number -> {"val": [{step, tokens, loss}...], "train": [...]} (`trials --json`); a trial that reused
    another's result has that trial's curves."""
    own: dict[int, dict[str, list[dict[str, float]]]] = {}
    for p in val:
        own.setdefault(p.trial_number, {"val": [], "train": []})["val"].append(
            {"step": p.step, "tokens": p.tokens, "loss": p.val_loss}
        )
    for q in train:
        own.setdefault(q.trial_number, {"val": [], "train": []})["train"].append(
            {"step": q.step, "tokens": q.tokens, "loss": q.loss}
        )
    empty: dict[str, list[dict[str, float]]] = {"val": [], "train": []}
    return {
        r.number: own.get(r.number) or (own.get(r.reused_from, empty) if r.reused_from is not None else empty)
        for r in trial_records(trials)
    }


def has_result(t: Trial) -> bool:
    """A trial whose map was evaluated to the end, pruned, or diverged: its result stands for its map."""
    return record_of(t).has_result


def study_front(trials: Sequence[Trial]) -> list[dict[str, Any]]:
    """The Pareto front (perplexity, FLOPs) of the trials that trained their map to a result, as rows."""
    rows = [
        {
            "trial": r.number,
            "reuse_map": as_list(r.reuse_map),
            "map": map_text(r.map_key or ""),
            "knobs": knobs_text(r),
            "flops_ratio": r.flops_ratio,
            "val_ppl": r.val_ppl,
            "val_bpb": r.val_bpb,
            "params": r.param_count,
        }
        for r in trained_results(trials)
    ]
    return pareto_front(rows)


def references(study: optuna.Study) -> dict[str, Any]:
    return {k[len(REFERENCE_PREFIX) :]: v for k, v in study.user_attrs.items() if k.startswith(REFERENCE_PREFIX)}


def listed_trials(trials: Sequence[Trial]) -> list[TrialRecord]:
    """The trials a listing shows and counts: not the WAITING ones (a queued retry is not yet a trial), and not
    the surplus ones (asked past the target, never trained)."""
    return [r for r in trial_records(trials) if r.state != TrialState.WAITING and not r.surplus]


def reference_rows(study: optuna.Study) -> list[dict[str, Any]]:
    """The study's reference runs as rows of a listing, marked `reference` (the run's name) with the state
    REFERENCE: trained outside the sampler's view, so they have no trial number."""
    rows = []
    for name, ref in sorted(references(study).items()):
        knobs = ref.get("knobs")
        rows.append(
            {
                "trial": None,
                "reference": name,
                "state": "REFERENCE",
                "reuse_map": ref.get("reuse_map"),
                "knobs": format_knobs(knobs) if knobs else None,
                "flops_ratio": ref.get("flops_ratio"),
                "val_ppl": ref.get("val_ppl"),
                "val_bpb": ref.get("val_bpb"),
                "steps": ref.get("steps", 0),
                "seed": ref.get("seed"),
                "status": ref.get("status"),
                "schedule": ref.get("schedule"),
            }
            | ({"map": ref["map"]} if ref.get("map") else {})
        )
    return rows


def trained_trials(trials: Sequence[Trial]) -> list[TrialRecord]:
    """The trials that trained their map (complete, pruned or diverged), not those that reused a result."""
    return [r for r in trial_records(trials) if r.trained_its_map]


def trained_by_map(trials: Sequence[Trial]) -> dict[str, TrialRecord]:
    """Map key -> the trial that trained it (the first one, where two did)."""
    by_map: dict[str, TrialRecord] = {}
    for r in sorted(trained_trials(trials), key=lambda r: r.number):
        assert r.map_key is not None  # a trial that trained its map has its key
        by_map.setdefault(r.map_key, r)
    return by_map


def is_baseline(reuse_map: list[int] | None) -> bool:
    return bool(reuse_map and all(r == 1 for r in reuse_map))


def key_reuse_map(map_key: str, n_layers: int | None = None) -> list[int]:
    """The per-layer counts of a trial's map key ("2,1,1,1", "2,1,1,1|injection=add" with knobs on, or a block
    map "block:1-2:2", whose counts need the model's `n_layers`)."""
    return list(MapKey.parse(map_key, n_layers).map.counts)


DEEP_PREFIX = "deep"  # the race's equal-compute reference: deepR, the study's model with R layers, each run once


def deep_key(layer_runs: int) -> str:
    return f"{DEEP_PREFIX}{layer_runs}"


def is_deep_key(key: str) -> bool:
    """An equal-compute reference's key (deepR), not a reuse map of the study's model."""
    return key.startswith(DEEP_PREFIX) and key[len(DEEP_PREFIX) :].isdigit()


def is_all_ones_key(map_key: str) -> bool:
    """The all-ones map, whatever its knobs (a canonical block map is never all ones)."""
    return not is_block_text(map_key) and is_baseline(key_reuse_map(map_key))


def is_baseline_key(map_key: str) -> bool:
    """The paper's baseline: the all-ones map with every knob off."""
    return not is_block_text(map_key) and MapKey.parse(map_key).is_baseline


def finite_or_none(x: float) -> float | None:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None
