"""Reading a study's trials back: rows, which trials stand for their map, the front, reference runs."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import optuna
from optuna.trial import TrialState

from ilr_search.analysis.pareto import pareto_front
from ilr_search.config import SpaceConfig
from ilr_search.knobs import format_knobs
from ilr_search.storage import CurvePoint, Run, Store, TrainCurvePoint, stored_references
from ilr_search.storage.trials import TrialRecord, trained_results
from ilr_search.training.schedule import Map, format_reuse_map, key_text, map_text


def as_list(ints: tuple[int, ...] | None) -> list[int] | None:
    """A record's map as the lists rows and JSON show."""
    return list(ints) if ints is not None else None


def knobs_text(r: TrialRecord) -> str | None:
    """A trial's knobs as rows show them (`injection=add`), None where none is set or every one is at its
    default (a judged candidate without the knob its rival sets)."""
    return (format_knobs(r.knobs) if r.knobs else "") or None


Curves = dict[int, dict[int, float]]  # trial number -> {step: val_loss}, from the store (the one place curves live)


def curves_by_trial(points: Iterable[CurvePoint]) -> Curves:
    curves: Curves = {}
    for p in points:
        curves.setdefault(p.trial_number, {})[p.step] = p.val_loss
    return curves


def curve_of(r: TrialRecord, curves: Curves) -> dict[int, float]:
    """A trial's learning curve; a trial that reused another's result has that trial's curve."""
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
    for ref in reference_rows(store):
        label = format_reuse_map(ref.reuse_map) if ref.reuse_map else ref.name
        rows += [CurveRow(None, ref.name, label, "val", step, step * per_step, loss) for step, loss in ref.curve]
    for row in race_run_rows(store.race_runs(), study.user_attrs):
        run = row.run
        rows += [
            CurveRow(None, None, run.job.map_key, "val", step, tokens, loss, run.job.seed, run.steps)
            for step, tokens, loss in row.val_curve
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


@dataclass(frozen=True)
class RaceRunRow:
    """A stored race run (the race's and the audit's runs beyond the trials, whatever their state) as `trials`
    lists it: the run (storage Run: its job, state, FLOPs, result, curve), its map parsed (`key`; None for an
    equal-compute deepR, which is no map of the study's model), and the training tokens a step of it sees.
    to_dict is its row of `trials --json`, with its curves in the trials' shape (validation points; the race
    stores no training curve, so `train` is empty)."""

    run: Run
    key: Map | None
    tokens_per_step: int

    @property
    def val_curve(self) -> list[tuple[int, int, float]]:
        """(step, tokens, validation loss) of each stored point."""
        return [(step, step * self.tokens_per_step, loss) for step, loss in self.run.curve]

    def to_dict(self) -> dict[str, Any]:
        r = self.run
        return {
            "map_key": r.job.map_key,
            "reuse_map": list(self.key.counts) if self.key else None,
            "knobs": self.key.knobs or None if self.key else None,
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
            "unit_scores": list(r.scores) or None,
            "curves": {
                "val": [{"step": step, "tokens": tokens, "loss": loss} for step, tokens, loss in self.val_curve],
                "train": [],
            },
        }


def race_run_rows(runs: Sequence[Run], study_attrs: Mapping[str, Any]) -> list[RaceRunRow]:
    """Every stored race run (of `runs`, the store's: its reference runs passed over) as a row of a listing
    (RaceRunRow), in the store's order."""
    per_step = tokens_per_step(study_attrs)
    config = study_attrs.get("ilr:config")  # search/plan.py's CONFIG_ATTR
    n_layers = int(config["model"]["n_layers"]) if config else None
    rows = []
    for r in runs:
        if r.kind == "race":
            parsed = Map.parse(r.job.map_key, n_layers)
            rows.append(RaceRunRow(r, None if parsed.is_deeper else parsed, per_step))
    return rows


LossPoint = tuple[int, int, float]  # (step, tokens, loss) of a learning curve


@dataclass(frozen=True)
class TrialRow:
    """A trial as `trials` lists it: its record and its learning curves, validation (`val`) and training-loss
    window means (`train`), as (step, tokens, loss) points; a trial that reused another's result has that
    trial's curves. to_dict is its row of `trials --json`."""

    record: TrialRecord
    val: tuple[LossPoint, ...]
    train: tuple[LossPoint, ...]

    def to_dict(self) -> dict[str, Any]:
        r = self.record
        # capacity below 1: each routed pass's realised fraction ("LAYER:REPEAT") and realised FLOPs, beside C
        routed = (
            {"route_fractions": r.route_fractions, "realised_flops_ratio": r.realised_flops_ratio}
            if r.route_fractions is not None
            else {}
        )
        return {
            "trial": r.number,
            "state": r.state.name,
            "reuse_map": as_list(r.reuse_map),
            "map": map_text(r.map_key) if r.map_key else None,
            "knobs": knobs_text(r),
            **routed,
            "flops_ratio": r.flops_ratio,
            "params": r.param_count,
            "val_ppl": r.val_ppl,
            "val_bpb": r.val_bpb,
            "steps": r.steps,
            "pruned_at_step": r.pruned_at_step,
            "reused_from": r.reused_from,
            "proposed_map": as_list(r.proposed_map),
            "reason": r.reason,
            "seconds": r.seconds,
            "curves": {
                kind: [{"step": step, "tokens": tokens, "loss": loss} for step, tokens, loss in points]
                for kind, points in (("val", self.val), ("train", self.train))
            },
        }


def trial_rows(trials: Sequence[TrialRecord], val: list[CurvePoint], train: list[TrainCurvePoint]) -> list[TrialRow]:
    """Each trial with its curves (TrialRow), in the trials' order."""
    own: dict[int, tuple[list[LossPoint], list[LossPoint]]] = {}
    for p in val:
        own.setdefault(p.trial_number, ([], []))[0].append((p.step, p.tokens, p.val_loss))
    for q in train:
        own.setdefault(q.trial_number, ([], []))[1].append((q.step, q.tokens, q.loss))
    rows = []
    for r in trials:
        found = own.get(r.number) or (own.get(r.reused_from) if r.reused_from is not None else None) or ([], [])
        rows.append(TrialRow(r, tuple(found[0]), tuple(found[1])))
    return rows


@dataclass(frozen=True)
class FrontRow:
    """A point of a Pareto front as the reports show it: its trial (None for a map no trial trained), map, knobs
    (as text), FLOPs, perplexity, bits per byte and parameter count. A point of the race's front (search/race_results.py
    front_rows) adds where it stands: its length `steps`, its `seeds`, the [low, high] perplexity `interval`
    ([None, None] where the race has none), whether it is `confirmed` better than the cheaper points, and
    `is_baseline` (the reference the others are judged against; the JSON key `reference`). `within_noise_of`
    (mark_ties): the trials of the other front points whose perplexity is within the baseline's seed noise, None
    where not marked. to_dict is its JSON form."""

    trial: int | None
    reuse_map: tuple[int, ...] | None
    map: str
    knobs: str | None
    flops_ratio: float
    val_ppl: float
    val_bpb: float | None
    params: int | None
    steps: int | None = None  # None: a proxy point (the fields below are the race's)
    seeds: tuple[int, ...] = ()
    interval: tuple[float | None, float | None] = (None, None)
    confirmed: bool = False
    is_baseline: bool = False
    within_noise_of: tuple[int | None, ...] | None = None

    @property
    def key(self) -> str:
        """The point's map key: its map (or its reuse map's counts) with its knobs."""
        return key_text(self.map or Map.of_counts(self.reuse_map or ()).text, self.knobs)

    @property
    def raced(self) -> bool:
        """A point of the race's front (with its length, seeds and interval)."""
        return self.steps is not None

    def beyond_proxy(self, base_steps: int) -> bool:
        """A point the race took past the proxy: at more than one seed, or at another length than `base_steps`."""
        return bool(self.seeds) and (len(self.seeds) > 1 or self.steps != base_steps)

    def to_dict(self, fields: Sequence[str] | None = None) -> dict[str, Any]:
        """Its JSON form: every field it has, or only `fields`, in that order."""
        row: dict[str, Any] = {
            "trial": self.trial,
            "reuse_map": as_list(self.reuse_map),
            "map": self.map,
            "knobs": self.knobs,
            "flops_ratio": self.flops_ratio,
            "val_ppl": self.val_ppl,
            "val_bpb": self.val_bpb,
            "params": self.params,
        }
        if self.steps is not None:
            row |= {
                "steps": self.steps,
                "seeds": list(self.seeds),
                "interval": list(self.interval),
                "confirmed": self.confirmed,
                "reference": self.is_baseline,
            }
        if self.within_noise_of is not None:
            row["within_noise_of"] = list(self.within_noise_of)
        return row if fields is None else {k: row[k] for k in fields}


@dataclass(frozen=True)
class LayerView:
    """What `pareto --view layers` shows (commands/report.py layer_view): the decided front's maps, and the
    importance for perplexity of each layer's count and of each searched knob (name -> importance; empty where
    nothing could be attributed)."""

    front_maps: tuple[FrontRow, ...]
    importance: Mapping[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {"front_maps": [p.to_dict() for p in self.front_maps], "importance": dict(self.importance)}


def study_front(trials: Sequence[TrialRecord]) -> list[FrontRow]:
    """The Pareto front (perplexity, FLOPs) of the trials that trained their map to a result, cheapest first."""
    rows = [
        FrontRow(
            r.number,
            r.reuse_map,
            map_text(r.map_key or ""),
            knobs_text(r),
            cast(float, r.flops_ratio),  # a trained result has its FLOPs and perplexity
            cast(float, r.val_ppl),
            r.val_bpb,
            r.param_count,
        )
        for r in trained_results(trials)
    ]
    return pareto_front(rows, lambda p: (p.val_ppl, p.flops_ratio))


@dataclass(frozen=True)
class ReferenceRow:
    """A reference run as `trials` lists it; to_dict is its row, marked `reference` (its name) with the state
    REFERENCE."""

    run: Run

    def to_dict(self) -> dict[str, Any]:
        ref = self.run
        return {
            "trial": None,
            "reference": ref.name,
            "state": "REFERENCE",
            "reuse_map": as_list(ref.reuse_map),
            "knobs": format_knobs(ref.knobs) if ref.knobs else None,
            "flops_ratio": ref.flops_ratio,
            "val_ppl": ref.val_ppl,
            "val_bpb": ref.val_bpb,
            "steps": ref.steps,
            "seed": ref.seed,
            "status": ref.status,
            "schedule": as_list(ref.schedule),
        } | ({"map": ref.block_map} if ref.block_map else {})


def listed_trials(trials: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The trials a listing shows and counts: not the WAITING ones (a queued retry is not yet a trial), and not
    the surplus ones (asked past the target, never trained)."""
    return [r for r in trials if r.state != TrialState.WAITING and not r.surplus]


def reference_rows(store: Store) -> list[Run]:
    """The study's reference runs in a listing's order (by name)."""
    return [ref for _, ref in sorted(stored_references(store.reference_runs()).items())]


def trained_trials(trials: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The trials that trained their map (complete, pruned or diverged), not those that reused a result."""
    return [r for r in trials if r.trained_its_map]


def trained_by_map(trials: Sequence[TrialRecord]) -> dict[str, TrialRecord]:
    """Map key -> the trial that trained it (the first one, where two did)."""
    by_map: dict[str, TrialRecord] = {}
    for r in sorted(trained_trials(trials), key=lambda r: r.number):
        assert r.map_key is not None  # a trial that trained its map has its key
        by_map.setdefault(r.map_key, r)
    return by_map


def is_baseline(reuse_map: list[int] | None) -> bool:
    return bool(reuse_map and all(r == 1 for r in reuse_map))


def finite_or_none(x: float) -> float | None:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None
