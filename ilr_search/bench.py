"""A tabular benchmark of the search: every feasible map of a small space trained once, with its full learning
curve, so that samplers (and pruning) can be replayed over the table in seconds instead of hours, against a
known exhaustive Pareto front (the way NAS-Bench-style tabular benchmarks work)."""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from .pareto import non_dominated
from .pruning import pareto_verdict
from .report import _atomic_write, check_out_path
from .space import load_space
from .store import CurvePoint
from .storage import parse_storage
from .study import (RunReporter, build_sampler, open_study, plan_study, propose_map, run_study, sampler_settings,
                    seed_maps)


def feasible_maps(n_layers: int, max_reuse: int, max_layer_runs: int) -> list[list[int]]:
    """Every reuse map with counts in 1..max_reuse whose schedule fits the budget."""
    return [list(m) for m in itertools.product(range(1, max_reuse + 1), repeat=n_layers) if sum(m) <= max_layer_runs]


def build_table(space_path: str | Path, out: str | Path, budget: str = "2x", storage: str | None = None,
                study_name: str | None = None, reporter: RunReporter | None = None) -> dict[str, Any]:
    """Train every feasible map of the space (a brute-force study, so the build resumes) and write the table."""
    path = check_out_path(out, (".parquet", ".csv"))
    space = load_space(space_path, {"search": {"enqueue_paper_maps": False, "noise_seeds": 0, "families": ["ilr"]}})
    plan = plan_study(space, budget, None)
    maps = feasible_maps(plan.model.n_layers, space.search.max_reuse, plan.budget.max_layer_runs(plan.model))
    name = study_name or f"bench-{Path(space_path).stem}-{plan.budget.text}"
    started = time.perf_counter()
    run_study(space, budget, name, storage, n_trials=len(maps), sampler="random", pruner="none",
              reporter=reporter, enqueue_maps=maps)
    seconds = time.perf_counter() - started
    rows = []
    for t in open_study(parse_storage(storage), name).get_trials(deepcopy=False):
        a = t.user_attrs
        if t.state != optuna.trial.TrialState.COMPLETE or "reused_from" in a:
            continue
        rows.append({"reuse_map": ",".join(map(str, a["reuse_map"])), "flops_ratio": a["flops_ratio"],
                     "val_ppl": a["val_ppl"], "val_bpb": a["val_bpb"], "curve": json.dumps(a["curve"]),
                     "steps": space.train.steps, "trial": t.number, "train_seconds": a.get("train_seconds")})
    import pandas as pd

    frame = pd.DataFrame(rows).sort_values("reuse_map").reset_index(drop=True)
    meta = {"space": str(space_path), "budget": budget, "n_layers": plan.model.n_layers,
            "max_reuse": space.search.max_reuse, "max_layer_runs": plan.budget.max_layer_runs(plan.model),
            "steps": space.train.steps, "rungs": space.train.eval_steps[:-1], "study": name}
    frame["meta"] = json.dumps(meta)
    if path.suffix == ".parquet":
        _atomic_write(path, lambda p: frame.to_parquet(p, index=False))
    else:
        _atomic_write(path, lambda p: frame.to_csv(p, index=False))
    return {"out": str(path), "maps": len(frame), "feasible_maps": len(maps), "build_seconds_this_run": seconds,
            "study": name}


# ----------------------------------------------------------------------------------------------------
# Replay

@dataclass(frozen=True)
class Table:
    n_layers: int
    max_reuse: int
    max_layer_runs: int
    steps: int
    rungs: tuple[int, ...]
    entries: dict[tuple[int, ...], dict[str, Any]]  # map -> {"flops_ratio", "val_ppl", "curve": {step: loss}}

    @classmethod
    def read(cls, path: str | Path) -> Table:
        import pandas as pd

        frame = pd.read_parquet(path) if str(path).endswith(".parquet") else pd.read_csv(path)
        meta = json.loads(frame["meta"].iloc[0])
        entries = {tuple(int(x) for x in str(r["reuse_map"]).split(",")): {
            "flops_ratio": float(r["flops_ratio"]), "val_ppl": float(r["val_ppl"]),
            "curve": {int(s): float(v) for s, v in json.loads(r["curve"])}} for r in frame.to_dict("records")}
        return cls(meta["n_layers"], meta["max_reuse"], meta["max_layer_runs"], meta["steps"], tuple(meta["rungs"]),
                   entries)

    def points(self) -> list[tuple[float, float]]:
        return [(e["val_ppl"], e["flops_ratio"]) for e in self.entries.values()]

    def reference_point(self) -> tuple[float, float]:
        ppl = [p for p, _ in self.points()]
        ratio = [r for _, r in self.points()]
        return max(ppl) * 1.01, max(ratio) * 1.01

    def front(self) -> list[tuple[int, ...]]:
        keys = list(self.entries)
        return [keys[i] for i in non_dominated(self.points())]

    @property
    def exhaustive_steps(self) -> int:
        return len(self.entries) * self.steps


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
        return next((s for s, h in zip(self.steps, self.hv_fraction) if h >= fraction - 1e-12), None)

    def hv_at(self, steps: int) -> float:
        return max([h for s, h in zip(self.steps, self.hv_fraction) if s <= steps], default=0.0)


def replay(table: Table, sampler: str, seed: int, n_trials: int, pruning: bool, eta: float = 3.0,
           epsilon: float = 0.01, warmup: int = 4, rung_fractions: Sequence[float] = (0.125, 0.25, 0.5)) -> ReplayResult:
    """Run the search's proposal logic (seed maps, sampler, budget repair, reuse of evaluated maps, Pareto
    pruning at the rungs, by default at 1/8, 1/4 and 1/2 of the steps like the default space) with results
    looked up in the table instead of trained."""
    rungs = [r for r in table.rungs if any(abs(r - f * table.steps) < 0.5 + 1e-9 for f in rung_fractions)]
    settings = sampler_settings(sampler, seed, table.n_layers, table.max_reuse)
    study = optuna.create_study(directions=["minimize", "minimize"],
                                sampler=build_sampler(settings, table.n_layers))
    for m in seed_maps(table.n_layers, table.max_reuse, table.max_layer_runs):
        study.enqueue_trial({f"r{i}": r for i, r in enumerate(m)}, skip_if_exists=True)
    reference = table.reference_point()
    exhaustive = hypervolume_2d(table.points(), reference)
    true_front = set(table.front())
    results: dict[tuple[int, ...], tuple[str, tuple[float, float] | None]] = {}
    rung_points: dict[int, list[CurvePoint]] = {}
    steps_total = steps_saved = 0
    found: list[tuple[float, float]] = []
    out = ReplayResult(sampler, seed, pruning, [], [], 0, [])
    for number in range(n_trials):
        trial = study.ask()
        _, reuse_map = propose_map(trial, table.n_layers, table.max_reuse, table.max_layer_runs)
        key = tuple(reuse_map)
        if key not in results:
            entry = table.entries[key]
            state, values = "complete", (entry["val_ppl"], entry["flops_ratio"])
            run = table.steps
            for rung in (rungs if pruning else ()):
                me = CurvePoint(number, rung, entry["curve"][rung], entry["flops_ratio"], ",".join(map(str, key)))
                rung_points.setdefault(rung, []).append(me)
                if not pareto_verdict(me, rung_points[rung], eta, epsilon, warmup).keep:
                    state, values, run = "pruned", None, rung
                    steps_saved += table.steps - rung
                    if key in true_front:
                        out.front_maps_pruned.append(key)
                    break
            steps_total += run
            results[key] = (state, values)
            if values is not None:
                found.append(values)
        state, values = results[key]
        if state == "pruned":
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, values)
        out.steps.append(steps_total)
        out.hv_fraction.append(hypervolume_2d(found, reference) / exhaustive if exhaustive > 0 else 1.0)
    out.steps_saved = steps_saved
    return out


def summarize_replays(table: Table, results: list[ReplayResult]) -> list[dict[str, Any]]:
    """One row per (sampler, pruning): medians over seeds."""
    import statistics

    rows = []
    for (sampler, pruning), group in itertools.groupby(sorted(results, key=lambda r: (r.sampler, r.pruning)),
                                                        key=lambda r: (r.sampler, r.pruning)):
        group = list(group)
        exhaustive = table.exhaustive_steps

        def median_steps(fraction: float) -> float | None:
            """Median over seeds of the compute to reach `fraction`; a seed that never does counts as infinite."""
            values = sorted(math.inf if v is None else v for v in (r.steps_to(fraction) for r in group))
            median = statistics.median(values)
            return None if math.isinf(median) else median / exhaustive

        rows.append({
            "sampler": sampler, "pruning": pruning, "seeds": len(group),
            "compute_to_90pct": median_steps(0.90), "compute_to_95pct": median_steps(0.95),
            "hv_at_25pct_compute": statistics.median(r.hv_at(int(0.25 * exhaustive)) for r in group),
            "final_hv": statistics.median(r.hv_fraction[-1] for r in group),
            "steps_saved_share": statistics.median(
                r.steps_saved / (r.steps[-1] + r.steps_saved) if r.steps[-1] + r.steps_saved else 0.0 for r in group),
            "front_maps_pruned": sum(len(r.front_maps_pruned) for r in group),
        })
    return rows

