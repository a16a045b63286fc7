"""Replaying the search over a bench table: the sampler's proposals, the budget repair, the reuse of evaluated maps
and pruning at the rungs, with results looked up instead of trained, scored by the hypervolume of the front found
against the table's exhaustive front (benchmarks/search_efficiency.py)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import optuna

from ilr_search.analysis.pareto import non_dominated
from ilr_search.commands.bench.pruning import feed_curve
from ilr_search.commands.bench.table import Table
from ilr_search.config import PrunerSettings
from ilr_search.search.maps import first_maps, propose_map
from ilr_search.search.samplers import build_sampler, sampler_settings
from ilr_search.storage import CurvePoint


def table_entries(table: Table) -> dict[tuple[int, ...], dict[str, Any]]:
    """A bench table's reuse-map rows by map: {"flops_ratio", "val_ppl", "curve"}."""
    return {
        r.reuse_map: {"flops_ratio": r.flops_ratio, "val_ppl": r.val_ppl, "curve": r.curve}
        for r in table.rows
        if r.reuse_map is not None
    }


def reference_point(table: Table) -> tuple[float, float]:
    """The hypervolume's reference point: 1% beyond the table's worst perplexity and largest FLOPs ratio."""
    ppl = [p for p, _ in table.points()]
    ratio = [r for _, r in table.points()]
    return max(ppl) * 1.01, max(ratio) * 1.01


def table_front(table: Table) -> list[tuple[int, ...]]:
    """The reuse maps on the table's final front (a block row on it is left out)."""
    return [m for i in non_dominated(table.points()) if (m := table.rows[i].reuse_map) is not None]


def exhaustive_steps(table: Table) -> int:
    """The steps that training every reuse map of the table takes."""
    return len(table_entries(table)) * table.steps


def hypervolume_2d(points: Sequence[Sequence[float]], reference: Sequence[float]) -> float:
    """Area dominated by `points` (both objectives minimised) and bounded by `reference`."""
    inside = sorted((a, b) for a, b in points if a < reference[0] and b < reference[1])
    area, best_b = 0.0, reference[1]
    for i, (a, b) in enumerate(inside):
        best_b = min(best_b, b)
        next_a = inside[i + 1][0] if i + 1 < len(inside) else reference[0]
        area += (next_a - a) * (reference[1] - best_b)
    return area


@dataclass
class ReplayResult:
    sampler: str
    seed: int
    pruning: bool
    steps: list[int]  # cumulative training steps after each trial
    hv_fraction: list[float]  # found front's hypervolume / exhaustive hypervolume after each trial
    steps_saved: int
    front_maps_pruned: list[tuple[int, ...]]

    def steps_to(self, fraction: float) -> int | None:
        return next((s for s, h in zip(self.steps, self.hv_fraction, strict=True) if h >= fraction - 1e-12), None)

    def hv_at(self, steps: int) -> float:
        return max([h for s, h in zip(self.steps, self.hv_fraction, strict=True) if s <= steps], default=0.0)


def replay(
    table: Table,
    sampler: str,
    seed: int,
    n_trials: int,
    pruning: bool,
    settings: PrunerSettings | None = None,
    rung_fractions: Sequence[float] = (0.125, 0.25, 0.5),
) -> ReplayResult:
    """Run the search's proposal logic (seed maps, sampler, budget repair, reuse of evaluated maps, pruning at
    the rungs, by default at 1/8, 1/4 and 1/2 of the steps like the default space, with the default rule)
    with results looked up in the table instead of trained. A map the table lacks (it diverged, or the table
    is partial) ends FAIL at no cost."""
    settings = dataclasses.replace(settings or PrunerSettings(), rungs=table.rungs_at(rung_fractions))
    sampler_cfg = sampler_settings(sampler, seed, table.max_reuse)
    study = optuna.create_study(
        directions=["minimize", "minimize"],
        sampler=build_sampler(
            sampler_cfg, table.n_layers, max_reuse=table.max_reuse, max_layer_runs=table.max_layer_runs
        ),
    )
    for m in first_maps(table.n_layers, table.max_reuse, table.max_layer_runs):
        study.enqueue_trial({f"r{i}": r for i, r in enumerate(m)}, skip_if_exists=True)
    reference = reference_point(table)
    entries = table_entries(table)
    exhaustive = hypervolume_2d([(e["val_ppl"], e["flops_ratio"]) for e in entries.values()], reference)
    true_front = set(table_front(table))
    results: dict[tuple[int, ...], tuple[str, tuple[float, float] | None]] = {}
    points: list[CurvePoint] = []
    steps_total = steps_saved = 0
    found: list[tuple[float, float]] = []
    out = ReplayResult(sampler, seed, pruning, [], [], 0, [])
    for number in range(n_trials):
        trial = study.ask()
        _, reuse_map = propose_map(trial, table.n_layers, table.max_reuse, table.max_layer_runs)
        key = tuple(reuse_map)
        if key not in results:
            entry = entries.get(key)
            if entry is None:
                results[key] = ("fail", None)
            else:
                pruned_at = feed_curve(
                    number,
                    ",".join(map(str, key)),
                    entry["flops_ratio"],
                    entry["curve"],
                    table.steps,
                    points,
                    settings if pruning else None,
                )
                if pruned_at is None:
                    point = (entry["val_ppl"], entry["flops_ratio"])
                    results[key] = ("complete", point)
                    steps_total += table.steps
                    found.append(point)
                else:
                    results[key] = ("pruned", None)
                    steps_total += pruned_at
                    steps_saved += table.steps - pruned_at
                    if key in true_front:
                        out.front_maps_pruned.append(key)
        state, values = results[key]
        if state == "complete":
            study.tell(trial, values)
        else:
            study.tell(
                trial, state=optuna.trial.TrialState.PRUNED if state == "pruned" else optuna.trial.TrialState.FAIL
            )
        out.steps.append(steps_total)
        out.hv_fraction.append(hypervolume_2d(found, reference) / exhaustive if exhaustive > 0 else 1.0)
    out.steps_saved = steps_saved
    return out


def _median_steps(group: list[ReplayResult], fraction: float, exhaustive: int) -> float | None:
    """Median over seeds of the compute to reach `fraction`, as a share of `exhaustive`; a seed that never does counts
    as infinite."""
    values = sorted(math.inf if v is None else v for v in (r.steps_to(fraction) for r in group))
    median = statistics.median(values)
    return None if math.isinf(median) else median / exhaustive


def summarize_replays(table: Table, results: list[ReplayResult]) -> list[dict[str, Any]]:
    """One row per (sampler, pruning): medians over seeds."""

    rows = []
    for (sampler, pruning), grouped in itertools.groupby(
        sorted(results, key=lambda r: (r.sampler, r.pruning)), key=lambda r: (r.sampler, r.pruning)
    ):
        group = list(grouped)
        exhaustive = exhaustive_steps(table)
        rows.append(
            {
                "sampler": sampler,
                "pruning": pruning,
                "seeds": len(group),
                "compute_to_90pct": _median_steps(group, 0.90, exhaustive),
                "compute_to_95pct": _median_steps(group, 0.95, exhaustive),
                "hv_at_25pct_compute": statistics.median(r.hv_at(int(0.25 * exhaustive)) for r in group),
                "final_hv": statistics.median(r.hv_fraction[-1] for r in group),
                "steps_saved_share": statistics.median(
                    r.steps_saved / (r.steps[-1] + r.steps_saved) if r.steps[-1] + r.steps_saved else 0.0 for r in group
                ),
                "front_maps_pruned": sum(len(r.front_maps_pruned) for r in group),
            }
        )
    return rows
