"""Reuse maps (and knob settings) a trial proposes: the sampler's counts repaired into the FLOP budget, and the
first maps a study tries."""

from __future__ import annotations

import math

import optuna

from ..knobs import KNOB_CHOICES, KnobValue


def repair_to_budget(reuse_map: list[int], max_layer_runs: int) -> list[int]:
    """The map scaled into the budget, keeping its shape: the extra iterations (r - 1) are scaled down in
    proportion and the iterations left over go to the largest remainders (ties: the larger request, then the
    earlier layer). Every layer keeps at least one run; a map within budget is returned unchanged."""
    extras = [r - 1 for r in reuse_map]
    allowed = max(0, max_layer_runs - len(reuse_map))
    total = sum(extras)
    if total <= allowed:
        return list(reuse_map)
    scaled = [e * allowed / total for e in extras]
    kept = [math.floor(x) for x in scaled]
    leftover = allowed - sum(kept)
    order = sorted(range(len(extras)), key=lambda i: (-(scaled[i] - kept[i]), -extras[i], i))
    for i in order[:leftover]:
        kept[i] += 1
    return [1 + e for e in kept]


def propose_knobs(trial: optuna.Trial, names: tuple[str, ...]) -> dict[str, KnobValue]:
    """The trial's setting of each searched knob: a categorical dimension named after the knob."""
    return {name: trial.suggest_categorical(name, KNOB_CHOICES[name]) for name in names}


def knobs_off(names: tuple[str, ...]) -> dict[str, KnobValue]:
    return {name: KNOB_CHOICES[name][0] for name in names}


def propose_map(trial: optuna.Trial, n_layers: int, max_reuse: int, max_layer_runs: int) -> tuple[list[int], list[int]]:
    """(proposed, trained) maps of a trial: the sampler's per-layer counts, and the same repaired to the budget.
    The sampler is told how far over budget its proposal was (<= 0: feasible) through a constraint."""
    proposed = [trial.suggest_int(f"r{i}", 1, max_reuse) for i in range(n_layers)]
    trial.set_constraint("budget", float(sum(proposed) - max_layer_runs))
    return proposed, repair_to_budget(proposed, max_layer_runs)


def seed_maps(n_layers: int, max_reuse: int, max_layer_runs: int) -> list[list[int]]:
    """The all-ones baseline and front-loaded maps in the spirit of the paper's findings ([4,2,1,1], [3,2,2,1]
    and [2,1,1,1] were its best small-model maps), repaired to the budget, without duplicates."""
    ones = [1] * n_layers
    shapes = [[2], [4, 2], [3, 2, 2], [2, 2]]
    maps, seen = [ones], {tuple(ones)}
    for head in shapes:
        m = [min(max_reuse, r) for r in head[:n_layers]] + [1] * max(0, n_layers - len(head))
        m = repair_to_budget(m, max_layer_runs)
        if tuple(m) not in seen:
            seen.add(tuple(m))
            maps.append(m)
    return maps
