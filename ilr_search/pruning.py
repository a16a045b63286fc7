"""Pruning by early validation loss.

Optuna cannot prune multi-objective studies (`Trial.report` raises there, optuna#3450), yet this study can:
its second objective, the FLOP ratio, is known exactly before training, so only the loss is uncertain.
`ParetoPruner` is a multi-objective, multi-fidelity rule in the spirit of MOASHA (Schmucker et al., 2021):
at each rung (an early evaluation step) a trial is compared, on (loss at the rung, FLOP ratio), with every
trial of the study that reached the same rung, read from the shared curve table, so every worker on every
machine decides the same from the same data. The single-objective variant (`--objective ppl`) uses
Optuna's own MedianPruner through `trial.report`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import optuna

from .pareto import dominates, non_dominated_ranks
from .store import CurvePoint, Store


@dataclass(frozen=True)
class Verdict:
    keep: bool
    reason: str
    dominated_by: tuple[int, ...] = ()


def pareto_verdict(me: CurvePoint, peers: Sequence[CurvePoint], eta: float, epsilon: float, warmup: int) -> Verdict:
    """Keep or prune `me` at a rung, given every trial's point at that rung (`me` included).

    - warm-up: nothing is pruned until `warmup` distinct maps reached the rung;
    - a point no other point dominates is always kept (a cheap map never loses to dearer ones it does not
      dominate);
    - otherwise it is kept if it is among the best ceil(n / eta) by non-dominated rank (then loss), or if its
      loss is within a factor (1 + epsilon) of the best loss the front reaches at no more compute.
    Ties (equal loss and ratio) dominate nothing, so they are kept or pruned together.
    """
    by_map: dict[str, CurvePoint] = {}
    for p in sorted(peers, key=lambda p: p.trial_number):  # a map counts once: its earliest trial
        by_map.setdefault(p.map_key, p)
    by_map.setdefault(me.map_key, me)
    points = sorted(by_map.values(), key=lambda p: p.trial_number)
    if len(points) < warmup:
        return Verdict(True, f"warm-up: {len(points)} of {warmup} maps reached step {me.step}")
    mine = (me.val_loss, me.flops_ratio)
    dominators = tuple(p.trial_number for p in points if dominates((p.val_loss, p.flops_ratio), mine))
    if not dominators:
        return Verdict(True, "on the rung's front")
    coords = [(p.val_loss, p.flops_ratio) for p in points]
    ranks = non_dominated_ranks(coords)
    order = sorted(range(len(points)), key=lambda i: (ranks[i], coords[i][0], coords[i][1]))
    keep_n = max(1, math.ceil(len(points) / eta))
    position = next(i for i, idx in enumerate(order) if coords[idx] == mine)
    if position < keep_n:
        return Verdict(True, f"rank {position + 1} of {len(points)}, within the best {keep_n}", dominators)
    front_loss = min(p.val_loss for i, p in enumerate(points) if ranks[i] == 0 and p.flops_ratio <= me.flops_ratio)
    if me.val_loss <= front_loss * (1 + epsilon):
        return Verdict(True, f"loss {me.val_loss:.4f} within {epsilon:.1%} of the front's {front_loss:.4f}", dominators)
    return Verdict(False, f"pruned at step {me.step}: loss {me.val_loss:.4f} at {me.flops_ratio:.3f}x is dominated by "
                          f"trial(s) {', '.join(map(str, dominators))} and ranks {position + 1} of {len(points)} "
                          f"(best {keep_n} continue)", dominators)


class ParetoPruner:
    def __init__(self, store: Store, rungs: Sequence[int], eta: float, epsilon: float, warmup: int) -> None:
        self.store, self.rungs = store, set(rungs)
        self.eta, self.epsilon, self.warmup = eta, epsilon, warmup

    def decide(self, trial: optuna.Trial, point: Any, flops_ratio: float, map_key: str) -> dict[str, Any] | None:
        """None to continue; else the pruning record (also stored with the trials that dominated it)."""
        if point.step not in self.rungs:
            return None
        me = CurvePoint(trial.number, point.step, point.val_loss, flops_ratio, map_key)
        verdict = pareto_verdict(me, self.store.curve_points(step=point.step), self.eta, self.epsilon, self.warmup)
        if verdict.keep:
            return None
        self.store.record_pruning(trial.number, point.step, point.val_loss, flops_ratio, list(verdict.dominated_by),
                                  verdict.reason)
        return {"step": point.step, "reason": verdict.reason, "dominated_by": list(verdict.dominated_by)}


class MedianPruning:
    """Single-objective studies: Optuna's MedianPruner decides through trial.report / should_prune."""

    def __init__(self, store: Store, rungs: Sequence[int]) -> None:
        self.store, self.rungs = store, set(rungs)

    def decide(self, trial: optuna.Trial, point: Any, flops_ratio: float, map_key: str) -> dict[str, Any] | None:
        if point.step not in self.rungs:
            return None
        trial.report(point.val_loss, point.step)
        if not trial.should_prune():
            return None
        reason = f"pruned at step {point.step} by Optuna's MedianPruner: loss {point.val_loss:.4f} above the median"
        self.store.record_pruning(trial.number, point.step, point.val_loss, flops_ratio, [], reason)
        return {"step": point.step, "reason": reason, "dominated_by": []}


def build_pruner(settings: dict[str, Any], store: Store) -> Any:
    name = settings["name"]
    if name == "none":
        return None
    if name == "median":
        return MedianPruning(store, settings["rungs"])
    return ParetoPruner(store, settings["rungs"], settings["eta"], settings["epsilon"], settings["warmup"])
