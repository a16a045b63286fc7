"""Reading a study's trials back: rows, which trials stand for their map, the front, reference runs."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from ilr_search.config import SpaceConfig
from ilr_search.knobs import format_knobs
from ilr_search.analysis.pareto import pareto_front
from ilr_search.storage import CurvePoint, Store, TrainCurvePoint

REFERENCE_PREFIX = "ilr:reference:"
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


def trial_row(t: FrozenTrial) -> dict[str, Any]:
    """One trial as the `trials` command shows it."""
    a = t.user_attrs
    return {
        "trial": t.number,
        "state": t.state.name,
        "reuse_map": a.get("reuse_map"),
        "knobs": format_knobs(a["knobs"]) if a.get("knobs") else None,
        "flops_ratio": a.get("flops_ratio"),
        "val_ppl": a.get("val_ppl"),
        "val_bpb": a.get("val_bpb"),
        "steps": a.get("steps", 0),
        "pruned_at_step": a.get("pruned_at_step"),
        "reused_from": a.get("reused_from"),
        "proposed_map": a.get("proposed_map"),
        "reason": a.get("reason"),
        "seconds": (t.datetime_complete - t.datetime_start).total_seconds()
        if t.datetime_complete and t.datetime_start else None,
    }


Curves = dict[int, dict[int, float]]  # trial number -> {step: val_loss}, from the store (the one place curves live)


def curves_by_trial(points: Iterable[CurvePoint]) -> Curves:
    curves: Curves = {}
    for p in points:
        curves.setdefault(p.trial_number, {})[p.step] = p.val_loss
    return curves


def curve_of(t: FrozenTrial, curves: Curves) -> dict[int, float]:
    """A trial's learning curve; a trial that reused another's result has that trial's curve."""
    return curves.get(t.number) or curves.get(t.user_attrs.get("reused_from", -1), {})


@dataclass(frozen=True)
class CurveRow:
    """One point of a learning curve in the long table of `export --curves`: a trial's (or a reference run's)
    validation loss (kind "val") or training-loss window mean (kind "train") at `step`."""
    trial: int | None  # None: a reference run
    reference: str | None
    map: str
    kind: str  # val | train
    step: int
    tokens: int
    loss: float


def curve_rows(study: optuna.Study, store: Store) -> list[CurveRow]:
    """Every stored curve point of the study's trials (those that trained: a trial that reused a result has
    none of its own), validation then training points of each trial, then the reference runs' validation
    curves (their tokens from the study's batch shape)."""
    rows: list[CurveRow] = []
    val = sorted(store.curve_points(), key=lambda p: (p.trial_number, p.step))
    train = store.train_curve_points()
    by_trial: dict[int, list[CurveRow]] = {}
    for p in val:
        by_trial.setdefault(p.trial_number, []).append(CurveRow(p.trial_number, None, p.map_key, "val", p.step,
                                                                p.tokens, p.val_loss))
    for q in train:
        by_trial.setdefault(q.trial_number, []).append(CurveRow(q.trial_number, None, q.map_key, "train", q.step,
                                                                q.tokens, q.loss))
    for number in sorted(by_trial):
        rows += by_trial[number]
    config = study.user_attrs.get("ilr:config")  # search/plan.py's CONFIG_ATTR (analysis sits below search)
    space = SpaceConfig.from_dict(config) if config is not None else None
    tokens_per_step = (space.train.batch_size * space.train.grad_accum * space.model.seq_len) if space is not None else 0
    for name, ref in sorted(references(study).items()):
        label = ",".join(map(str, ref["reuse_map"])) if ref.get("reuse_map") else name
        rows += [CurveRow(None, name, label, "val", int(step), int(step) * tokens_per_step, float(loss))
                 for step, loss in ref.get("curve", [])]
    return rows


def curves_of_trials(trials: list[FrozenTrial], val: list[CurvePoint],
                     train: list[TrainCurvePoint]) -> dict[int, dict[str, list[dict[str, float]]]]:
    """Trial number -> {"val": [{step, tokens, loss}...], "train": [...]} (`trials --json`); a trial that reused
    another's result has that trial's curves."""
    own: dict[int, dict[str, list[dict[str, float]]]] = {}
    for p in val:
        own.setdefault(p.trial_number, {"val": [], "train": []})["val"].append(
            {"step": p.step, "tokens": p.tokens, "loss": p.val_loss})
    for q in train:
        own.setdefault(q.trial_number, {"val": [], "train": []})["train"].append(
            {"step": q.step, "tokens": q.tokens, "loss": q.loss})
    empty: dict[str, list[dict[str, float]]] = {"val": [], "train": []}
    return {t.number: own.get(t.number) or own.get(t.user_attrs.get("reused_from", -1), empty) for t in trials}


def has_result(t: FrozenTrial) -> bool:
    """A trial whose map was evaluated to the end, pruned, or diverged: its result stands for its map."""
    return t.state in FINISHED or (t.state == TrialState.FAIL and t.user_attrs.get("status") == "diverged")


def study_front(trials: list[FrozenTrial]) -> list[dict[str, Any]]:
    rows = [{"trial": t.number, "reuse_map": t.user_attrs["reuse_map"],
             "knobs": format_knobs(t.user_attrs["knobs"]) if t.user_attrs.get("knobs") else None,
             "flops_ratio": t.user_attrs["flops_ratio"],
             "val_ppl": t.user_attrs["val_ppl"], "val_bpb": t.user_attrs.get("val_bpb"),
             "params": t.user_attrs.get("params")}
            for t in trials if t.state == TrialState.COMPLETE and "reused_from" not in t.user_attrs
            and t.user_attrs.get("val_ppl") is not None]
    return pareto_front(rows)


def references(study: optuna.Study) -> dict[str, Any]:
    return {k[len(REFERENCE_PREFIX):]: v for k, v in study.user_attrs.items() if k.startswith(REFERENCE_PREFIX)}


# A trial asked while the trials before it already made the study's target (two workers counted at the same
# moment): it trains nothing and ends FAIL with this attribute (search/objective.py).
SURPLUS_ATTR = "surplus"


def listed_trials(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The trials a listing shows and counts: not the WAITING ones (a queued retry is not yet a trial), and not
    the surplus ones (asked past the target, never trained)."""
    return [t for t in trials if t.state != TrialState.WAITING and not t.user_attrs.get(SURPLUS_ATTR)]


def reference_rows(study: optuna.Study) -> list[dict[str, Any]]:
    """The study's reference runs as rows of a listing, marked `reference` (the run's name) with the state
    REFERENCE: trained outside the sampler's view, so they have no trial number."""
    rows = []
    for name, ref in sorted(references(study).items()):
        knobs = ref.get("knobs")
        rows.append({"trial": None, "reference": name, "state": "REFERENCE",
                     "reuse_map": ref.get("reuse_map"), "knobs": format_knobs(knobs) if knobs else None,
                     "flops_ratio": ref.get("flops_ratio"), "val_ppl": ref.get("val_ppl"), "val_bpb": ref.get("val_bpb"),
                     "steps": ref.get("steps", 0), "seed": ref.get("seed"), "status": ref.get("status"),
                     "schedule": ref.get("schedule")})
    return rows


def trained_trials(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The trials that trained their map (complete, pruned or diverged), not those that reused a result."""
    return [t for t in trials if has_result(t) and "reused_from" not in t.user_attrs and t.user_attrs.get("map_key")]


def is_baseline(reuse_map: list[int] | None) -> bool:
    return bool(reuse_map) and all(r == 1 for r in reuse_map)


def key_reuse_map(map_key: str) -> list[int]:
    """The reuse map of a trial's map key ("2,1,1,1", or "2,1,1,1|injection=add" with knobs on)."""
    return [int(x) for x in map_key.split("|")[0].split(",")]


def is_baseline_key(map_key: str) -> bool:
    """The paper's baseline: the all-ones map with every knob off."""
    return "|" not in map_key and is_baseline(key_reuse_map(map_key))


def finite_or_none(x: float) -> float | None:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None
