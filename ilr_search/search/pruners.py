"""Pruning by early validation loss, and how far a rung's ranking can be trusted.

Optuna cannot prune multi-objective studies (`Trial.report` raises there, optuna#3450), yet this study can:
its second objective, the FLOP ratio, is known exactly before training, so only the loss is uncertain. At
each rung (an early evaluation step) a trial is compared, on (loss at the rung, FLOP ratio), with every trial
that reached the same rung, read from the shared curve table, so every worker on every machine decides the
same from the same data.

Learning curves of reuse maps cross: recurrent maps start slower and often overtake later, so a rung's
ranking can run backwards. Two rules:

- `pareto` (the default, calibrated): a rung may prune only once the study's own complete curves show that
  it predicts the final ranking (Spearman between rung loss and final loss of at least `min_spearman` over at
  least `calibration_maps` complete maps; the first, enqueued maps are never pruned and serve as calibration),
  and then only a map that a cheaper (or equally cheap) map leads at the rung by more than any lead the final
  loss was ever seen to overturn among the complete maps (the rung's `margin`), and that is not among the
  best 1/eta of the rung. A map is pruned on evidence that it cannot reach the final front.
- `pareto-eager` (the rule before calibration, kept to compare): in the spirit of MOASHA (Schmucker et al.,
  2021), a dominated map outside the best 1/eta and more than epsilon from the rung's front is pruned once
  `warmup` maps reached the rung, whatever the rung predicts.

The single-objective variant (`--objective ppl`) uses Optuna's own MedianPruner through `trial.report`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import optuna

from ilr_search.analysis.pareto import dominates, non_dominated_ranks
from ilr_search.analysis.stats import rank_agreement
from ilr_search.config import PrunerSettings, SpaceConfig
from ilr_search.storage import CurvePoint, Store


@dataclass(frozen=True)
class RungDecision:
    keep: bool
    reason: str
    dominated_by: tuple[int, ...] = ()


@dataclass(frozen=True)
class RungCalibration:
    """What a study's complete curves say about one rung."""

    step: int
    n_maps: int  # complete maps with a loss at this rung and at the final step
    spearman: float | None
    kendall: float | None
    margin: float  # the largest rung-loss lead (nats) that the final loss overturned among those maps

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def calibrate_rung(step: int, pairs: Sequence[tuple[float, float]]) -> RungCalibration:
    """`pairs`: (loss at the rung, final loss) of each complete map, one pair per map."""
    rung = [r for r, _ in pairs]
    final = [f for _, f in pairs]
    spearman, kendall = rank_agreement(rung, final)
    margin = 0.0
    for ra, fa in pairs:
        for rb, fb in pairs:
            if ra > rb and fa < fb:  # b led a at the rung, a finished ahead
                margin = max(margin, ra - rb)
    return RungCalibration(step, len(pairs), spearman, kendall, margin)


def final_pairs(points: Sequence[CurvePoint], step: int, final_step: int) -> list[tuple[float, float]]:
    """(rung loss, final loss) of every map whose curve reached `final_step`; a map counts once (its earliest
    trial that reached the end)."""
    by_trial: dict[int, dict[int, CurvePoint]] = {}
    for p in points:
        by_trial.setdefault(p.trial_number, {})[p.step] = p
    pairs: dict[str, tuple[float, float]] = {}
    for number in sorted(by_trial):
        curve = by_trial[number]
        if step in curve and final_step in curve:
            pairs.setdefault(curve[final_step].map_key, (curve[step].val_loss, curve[final_step].val_loss))
    return list(pairs.values())


def _distinct_maps(me: CurvePoint, peers: Sequence[CurvePoint]) -> list[CurvePoint]:
    """One point per map at the rung (its earliest trial); `me` stands for its own map."""
    by_map: dict[str, CurvePoint] = {}
    for p in sorted(peers, key=lambda p: p.trial_number):
        by_map.setdefault(p.map_key, p)
    by_map[me.map_key] = me
    return sorted(by_map.values(), key=lambda p: p.trial_number)


def _rank_position(me: CurvePoint, points: Sequence[CurvePoint]) -> tuple[int, list[int]]:
    """(position of `me` by non-dominated rank then loss, ranks of all points)."""
    coords = [(p.val_loss, p.flops_ratio) for p in points]
    ranks = non_dominated_ranks(coords)
    order = sorted(range(len(points)), key=lambda i: (ranks[i], coords[i][0], coords[i][1]))
    mine = (me.val_loss, me.flops_ratio)
    return next(i for i, idx in enumerate(order) if coords[idx] == mine), ranks


def pareto_decision(
    me: CurvePoint, peers: Sequence[CurvePoint], eta: float, epsilon: float, warmup: int
) -> RungDecision:
    """The eager rule: keep or prune `me` at a rung, given every trial's point at that rung.

    - warm-up: nothing is pruned until `warmup` distinct maps reached the rung;
    - a point no other point dominates is always kept (a cheap map never loses to dearer ones it does not
      dominate);
    - otherwise it is kept if it is among the best ceil(n / eta) by non-dominated rank (then loss), or if its
      loss is within a factor (1 + epsilon) of the best loss the front reaches at no more compute.
    Ties (equal loss and ratio) dominate nothing, so they are kept or pruned together.
    """
    points = _distinct_maps(me, peers)
    if len(points) < warmup:
        return RungDecision(True, f"warm-up: {len(points)} of {warmup} maps reached step {me.step}")
    mine = (me.val_loss, me.flops_ratio)
    dominators = tuple(p.trial_number for p in points if dominates((p.val_loss, p.flops_ratio), mine))
    if not dominators:
        return RungDecision(True, "on the rung's front")
    kept = _within_best(me, points, eta, dominators)
    if kept is not None:
        return kept
    position, ranks = _rank_position(me, points)
    keep_n = max(1, math.ceil(len(points) / eta))
    front_loss = min(p.val_loss for i, p in enumerate(points) if ranks[i] == 0 and p.flops_ratio <= me.flops_ratio)
    if me.val_loss <= front_loss * (1 + epsilon):
        return RungDecision(
            True, f"loss {me.val_loss:.4f} within {epsilon:.1%} of the front's {front_loss:.4f}", dominators
        )
    return RungDecision(
        False,
        f"pruned at step {me.step}: loss {me.val_loss:.4f} at {me.flops_ratio:.3f}x is dominated by "
        f"trial(s) {', '.join(map(str, dominators))} and ranks {position + 1} of {len(points)} "
        f"(best {keep_n} continue)",
        dominators,
    )


def _within_best(
    me: CurvePoint, points: Sequence[CurvePoint], eta: float, dominators: tuple[int, ...]
) -> RungDecision | None:
    """Keep `me` if it ranks within the best ceil(n / eta) of the rung's maps (rank by loss); else None."""
    position, _ = _rank_position(me, points)
    keep_n = max(1, math.ceil(len(points) / eta))
    if position < keep_n:
        return RungDecision(True, f"rank {position + 1} of {len(points)}, within the best {keep_n}", dominators)
    return None


def calibrated_decision(
    me: CurvePoint, peers: Sequence[CurvePoint], calibration: RungCalibration, settings: PrunerSettings
) -> RungDecision:
    """The default rule: prune only where the study's own complete curves show the rung predicts the end, and
    only a map that a no-dearer map leads by more than any lead the end was seen to overturn."""
    if calibration.n_maps < settings.calibration_maps:
        return RungDecision(
            True,
            f"calibrating step {me.step}: {calibration.n_maps} of {settings.calibration_maps} "
            "complete maps needed before this rung may prune",
        )
    rho = calibration.spearman
    if rho is None or rho < settings.min_spearman:
        shown = "undefined" if rho is None else f"{rho:+.2f}"
        return RungDecision(
            True,
            f"step {me.step} does not predict the final ranking (Spearman {shown} over "
            f"{calibration.n_maps} maps, {settings.min_spearman:.2f} needed): no pruning there",
        )
    points = _distinct_maps(me, peers)
    margin = calibration.margin
    dominators = tuple(
        p.trial_number
        for p in points
        if p.map_key != me.map_key
        and p.flops_ratio <= me.flops_ratio
        and p.val_loss * (1 + settings.epsilon) + margin < me.val_loss
    )
    if not dominators:
        return RungDecision(
            True,
            f"no map at {me.flops_ratio:.3f}x or less leads by more than the margin "
            f"{margin:.4f} (the largest lead the end overturned)",
        )
    kept = _within_best(me, points, settings.eta, dominators)
    if kept is not None:
        return kept
    return RungDecision(
        False,
        f"pruned at step {me.step}: loss {me.val_loss:.4f} at {me.flops_ratio:.3f}x trails "
        f"trial(s) {', '.join(map(str, dominators))} by more than the margin {margin:.4f}; "
        f"Spearman {rho:+.2f} over {calibration.n_maps} complete maps at this rung",
        dominators,
    )


def decision_at_rung(
    me: CurvePoint, points: Sequence[CurvePoint], final_step: int, settings: PrunerSettings
) -> RungDecision:
    """The decision of the study's rule for `me`, given every point of the study's curves (all steps)."""
    at_rung = [p for p in points if p.step == me.step]
    if settings.name == "pareto-eager":
        return pareto_decision(me, at_rung, settings.eta, settings.epsilon, settings.warmup)
    calibration = calibrate_rung(me.step, final_pairs(points, me.step, final_step))
    return calibrated_decision(me, at_rung, calibration, settings)


@dataclass(frozen=True)
class PruningDecision:
    step: int
    reason: str
    dominated_by: tuple[int, ...]


class Pruner:
    """The study's rule at each rung, deciding from the shared curve table (`pareto`, `pareto-eager`), or, for a
    single-objective study (`median`), Optuna's MedianPruner through trial.report / should_prune; a pruning is
    recorded in the store with its reason."""

    def __init__(self, store: Store, settings: PrunerSettings, final_step: int) -> None:
        self.store, self.settings, self.final_step = store, settings, final_step

    def decide(
        self, trial: optuna.Trial, step: int, val_loss: float, flops_ratio: float, map_key: str
    ) -> PruningDecision | None:
        """None to continue; else why the trial stops here."""
        if step not in self.settings.rungs:
            return None
        if self.settings.name == "median":
            trial.report(val_loss, step)
            if not trial.should_prune():
                return None
            reason = f"pruned at step {step} by Optuna's MedianPruner: loss {val_loss:.4f} above the median"
            decision = RungDecision(False, reason)
        else:
            me = CurvePoint(trial.number, step, val_loss, flops_ratio, map_key)
            decision = decision_at_rung(me, self.store.curve_points(), self.final_step, self.settings)
            if decision.keep:
                return None
        self.store.record_pruning(
            trial.number, step, val_loss, flops_ratio, list(decision.dominated_by), decision.reason
        )
        return PruningDecision(step, decision.reason, decision.dominated_by)


def build_pruner(settings: PrunerSettings, store: Store, final_step: int) -> Pruner | None:
    return None if settings.name == "none" else Pruner(store, settings, final_step)


def pruner_settings(space: SpaceConfig) -> PrunerSettings:
    s = space.search
    return PrunerSettings(
        name=s.pruner,
        rungs=tuple(space.train.eval_steps[:-1]),
        eta=s.prune_eta,
        epsilon=s.prune_epsilon,
        warmup=s.prune_warmup,
        calibration_maps=s.prune_calibration_maps,
        min_spearman=s.prune_min_spearman,
    )
