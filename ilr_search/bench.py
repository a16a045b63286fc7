"""A tabular benchmark of the search: every feasible map of a small space trained once, with its full learning
curve, so that samplers (and pruning) can be replayed over the table in seconds instead of hours, against a
known exhaustive Pareto front (the way NAS-Bench-style tabular benchmarks work)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from .config import PrunerSettings
from .errors import UserInputError
from .pareto import non_dominated
from .report import _atomic_write, check_out_path
from .results import curves_by_trial, references
from .search.maps import propose_map, seed_maps
from .search.plan import plan_study
from .search.progress import RunReporter
from .search.pruners import verdict_at_rung
from .search.run import run_study
from .search.samplers import build_sampler, sampler_settings
from .search.studies import open_study
from .space import load_space
from .storage import CurvePoint, open_store, parse_storage


def feasible_maps(n_layers: int, max_reuse: int, max_layer_runs: int) -> list[list[int]]:
    """Every reuse map with counts in 1..max_reuse whose schedule fits the budget."""
    return [list(m) for m in itertools.product(range(1, max_reuse + 1), repeat=n_layers) if sum(m) <= max_layer_runs]


def build_table(space_path: str | Path, out: str | Path, budget: str = "2x", storage: str | None = None,
                study_name: str | None = None, reporter: RunReporter | None = None, steps: int | None = None,
                sample: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Train every feasible map of the space (or a seeded sample of `sample` maps, the baseline always among
    them) as a brute-force study, so the build resumes, and write the table. Block recurrence K is added as
    a `blockK` row where the space's families include it and the budget allows it."""
    path = check_out_path(out, (".parquet", ".csv"))
    if sample is not None and sample < 1:
        raise UserInputError(f"--sample must be at least 1 map, got {sample}")
    space = load_space(space_path, {"search": {"enqueue_paper_maps": False, "noise_seeds": 0},
                                    "train": {"steps": steps}})
    plan = plan_study(space, budget, None)
    maps = feasible_maps(plan.model.n_layers, space.search.max_reuse, plan.budget.max_layer_runs(plan.model))
    if sample is not None and sample < len(maps):
        baseline = [1] * plan.model.n_layers
        others = [m for m in maps if m != baseline]
        maps = [baseline] + sorted(random.Random(seed).sample(others, sample - 1))
    name = study_name or (f"bench-{Path(space_path).stem}-{plan.budget.text}" + (f"-{steps}steps" if steps else "")
                          + (f"-sample{sample}-seed{seed}" if sample else ""))
    started = time.perf_counter()
    run_study(space, budget, name, storage, n_trials=len(maps), sampler="random", pruner="none",
              reporter=reporter, enqueue_maps=maps)
    seconds = time.perf_counter() - started
    rows = []
    study = open_study(parse_storage(storage), name)
    store = open_store(parse_storage(storage), name, read_only=True, storage=study._storage)
    curves = curves_by_trial(store.curve_points())
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        if t.state != optuna.trial.TrialState.COMPLETE or "reused_from" in a:
            continue
        rows.append({"reuse_map": ",".join(map(str, a["reuse_map"])), "flops_ratio": a["flops_ratio"],
                     "val_ppl": a["val_ppl"], "val_bpb": a["val_bpb"], "curve": json.dumps(sorted(curves[t.number].items())),
                     "steps": space.train.steps, "trial": t.number, "train_seconds": a.get("train_seconds")})
    for key, ref in sorted(references(study).items()):
        if key.startswith("block") and ref.get("val_ppl") is not None and ref.get("curve"):
            rows.append({"reuse_map": key, "flops_ratio": ref["flops_ratio"], "val_ppl": ref["val_ppl"],
                         "val_bpb": ref["val_bpb"], "curve": json.dumps(ref["curve"]), "steps": space.train.steps,
                         "trial": -1, "train_seconds": None})
    import pandas as pd

    frame = pd.DataFrame(rows).sort_values("reuse_map").reset_index(drop=True)
    meta = {"space": str(space_path), "budget": budget, "n_layers": plan.model.n_layers,
            "max_reuse": space.search.max_reuse, "max_layer_runs": plan.budget.max_layer_runs(plan.model),
            "steps": space.train.steps, "rungs": space.train.eval_steps[:-1], "study": name,
            "sample": sample, "sample_seed": seed if sample else None}
    frame["meta"] = json.dumps(meta)
    if path.suffix == ".parquet":
        _atomic_write(path, lambda p: frame.to_parquet(p, index=False))
    else:
        _atomic_write(path, lambda p: frame.to_csv(p, index=False))
    return {"out": str(path), "maps": len(frame), "feasible_maps": len(feasible_maps(
        plan.model.n_layers, space.search.max_reuse, plan.budget.max_layer_runs(plan.model))),
            "build_seconds_this_run": seconds, "study": name}


# ----------------------------------------------------------------------------------------------------
# Replay

@dataclass(frozen=True)
class TableRow:
    map_key: str  # "2,1,1,1", or "blockK" for block recurrence
    reuse_map: tuple[int, ...] | None  # None for a block-recurrence row
    flops_ratio: float
    val_ppl: float
    curve: dict[int, float]  # step -> validation loss


@dataclass(frozen=True)
class Table:
    """A table in the bench format: one row per trained map (reuse_map, flops_ratio, val_ppl, curve as JSON
    [[step, loss], ...], steps), optionally with a `meta` column (written by `bench build`). It may hold only
    some maps of a space, and block-recurrence rows (`block2`)."""

    n_layers: int
    max_reuse: int
    max_layer_runs: int
    steps: int
    rungs: tuple[int, ...]
    rows: tuple[TableRow, ...]  # in table order

    @property
    def entries(self) -> dict[tuple[int, ...], dict[str, Any]]:
        """Reuse-map rows by map: {"flops_ratio", "val_ppl", "curve"}."""
        return {r.reuse_map: {"flops_ratio": r.flops_ratio, "val_ppl": r.val_ppl, "curve": r.curve}
                for r in self.rows if r.reuse_map is not None}

    @classmethod
    def read(cls, path: str | Path) -> Table:
        import pandas as pd

        try:
            frame = pd.read_parquet(path) if str(path).endswith(".parquet") else pd.read_csv(path)
        except (OSError, ValueError) as e:
            raise UserInputError(f"cannot read bench table {str(path)!r}: {e}") from None
        missing = {"reuse_map", "flops_ratio", "val_ppl", "curve"} - set(frame.columns)
        if missing or frame.empty:
            raise UserInputError(f"{str(path)!r} is not a bench table: "
                                 + (f"columns {sorted(missing)} missing" if missing else "no rows"))
        rows = []
        for r in frame.to_dict("records"):
            key = str(r["reuse_map"]).strip()
            reuse = None if key.startswith("block") else tuple(int(x) for x in key.split(","))
            rows.append(TableRow(key, reuse, float(r["flops_ratio"]), float(r["val_ppl"]),
                                 {int(s): float(v) for s, v in json.loads(r["curve"])}))
        meta = json.loads(frame["meta"].iloc[0]) if "meta" in frame.columns else {}
        maps = [r.reuse_map for r in rows if r.reuse_map is not None]
        steps = int(meta.get("steps") or (frame["steps"].max() if "steps" in frame.columns
                                          else max(max(r.curve) for r in rows)))
        n_layers = int(meta.get("n_layers") or len(maps[0]))
        return cls(n_layers, int(meta.get("max_reuse") or max(max(m) for m in maps)),
                   int(meta.get("max_layer_runs") or max(sum(m) for m in maps)), steps,
                   tuple(meta.get("rungs") or sorted({s for r in rows for s in r.curve if s < steps})), tuple(rows))

    def points(self) -> list[tuple[float, float]]:
        return [(r.val_ppl, r.flops_ratio) for r in self.rows]

    def reference_point(self) -> tuple[float, float]:
        ppl = [p for p, _ in self.points()]
        ratio = [r for _, r in self.points()]
        return max(ppl) * 1.01, max(ratio) * 1.01

    def front(self) -> list[tuple[int, ...]]:
        """The reuse maps on the table's final front (a block row on it is left out)."""
        return [self.rows[i].reuse_map for i in non_dominated(self.points()) if self.rows[i].reuse_map is not None]

    def front_keys(self) -> list[str]:
        return [self.rows[i].map_key for i in non_dominated(self.points())]

    def rungs_at(self, fractions: Sequence[float]) -> tuple[int, ...]:
        return tuple(r for r in self.rungs if any(abs(r - f * self.steps) < 0.5 + 1e-9 for f in fractions))

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


def replay(table: Table, sampler: str, seed: int, n_trials: int, pruning: bool,
           settings: PrunerSettings | None = None, rung_fractions: Sequence[float] = (0.125, 0.25, 0.5)) -> ReplayResult:
    """Run the search's proposal logic (seed maps, sampler, budget repair, reuse of evaluated maps, pruning at
    the rungs, by default at 1/8, 1/4 and 1/2 of the steps like the default space, with the default rule)
    with results looked up in the table instead of trained. A map the table lacks (it diverged, or the table
    is partial) ends FAIL at no cost."""
    settings = dataclasses.replace(settings or PrunerSettings(), rungs=table.rungs_at(rung_fractions))
    sampler_cfg = sampler_settings(sampler, seed, table.n_layers, table.max_reuse)
    study = optuna.create_study(directions=["minimize", "minimize"],
                                sampler=build_sampler(sampler_cfg, table.n_layers, max_reuse=table.max_reuse,
                                                      max_layer_runs=table.max_layer_runs))
    for m in seed_maps(table.n_layers, table.max_reuse, table.max_layer_runs):
        study.enqueue_trial({f"r{i}": r for i, r in enumerate(m)}, skip_if_exists=True)
    reference = table.reference_point()
    entries = table.entries
    exhaustive = hypervolume_2d([(e["val_ppl"], e["flops_ratio"]) for e in entries.values()], reference)
    true_front = set(table.front())
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
                pruned_at = _feed_curve(number, ",".join(map(str, key)), entry["flops_ratio"], entry["curve"],
                                        table.steps, points, settings if pruning else None)
                if pruned_at is None:
                    results[key] = ("complete", (entry["val_ppl"], entry["flops_ratio"]))
                    steps_total += table.steps
                    found.append(results[key][1])
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
            study.tell(trial, state=optuna.trial.TrialState.PRUNED if state == "pruned" else optuna.trial.TrialState.FAIL)
        out.steps.append(steps_total)
        out.hv_fraction.append(hypervolume_2d(found, reference) / exhaustive if exhaustive > 0 else 1.0)
    out.steps_saved = steps_saved
    return out


def _feed_curve(number: int, map_key: str, ratio: float, curve: dict[int, float], final_step: int,
                points: list[CurvePoint], settings: PrunerSettings | None) -> int | None:
    """Feed a map's curve point by point, as a live trial records it, into `points`; the step where the rule
    prunes it, or None if it runs to the end (or there is no rule)."""
    for step in sorted(s for s in curve if s <= final_step):
        me = CurvePoint(number, step, curve[step], ratio, map_key)
        points.append(me)
        if settings is not None and step in settings.rungs and not verdict_at_rung(me, points, final_step, settings).keep:
            return step
    return None


@dataclass
class PruningReplay:
    """A pruning rule replayed over a table's rows, in table order or shuffled."""

    rule: str
    order_seed: int | None
    rungs: tuple[int, ...]
    n_rows: int
    pruned: list[dict[str, Any]]  # {"reuse_map", "step", "flops_ratio"}
    steps_trained: int
    steps_saved: int
    front: list[str]  # the table's own final front
    front_maps_lost: list[str]

    @property
    def steps_saved_share(self) -> float:
        total = self.steps_trained + self.steps_saved
        return self.steps_saved / total if total else 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"steps_saved_share": self.steps_saved_share}


def replay_pruning(table: Table, settings: PrunerSettings, order_seed: int | None = None,
                   rung_fractions: Sequence[float] = (0.125, 0.25, 0.5)) -> PruningReplay:
    """Feed every row of the table through the pruning rule, one map after another (table order, or shuffled
    by `order_seed`), and count the steps it saves and the table's front maps it loses."""
    settings = dataclasses.replace(settings, rungs=table.rungs_at(rung_fractions))
    rows = list(table.rows)
    if order_seed is not None:
        random.Random(order_seed).shuffle(rows)
    points: list[CurvePoint] = []
    pruned, trained, saved = [], 0, 0
    for number, row in enumerate(rows):
        step = _feed_curve(number, row.map_key, row.flops_ratio, row.curve, table.steps, points,
                           None if settings.name == "none" else settings)
        if step is None:
            trained += table.steps
        else:
            pruned.append({"reuse_map": row.map_key, "step": step, "flops_ratio": row.flops_ratio})
            trained += step
            saved += table.steps - step
    front = table.front_keys()
    lost = [p["reuse_map"] for p in pruned if p["reuse_map"] in front]
    return PruningReplay(settings.name, order_seed, settings.rungs, len(rows), pruned, trained, saved, front, lost)


def replay_table(path: str | Path, pruner: str = "pareto", order_seed: int | None = None) -> dict[str, Any]:
    """`ilr-search bench replay`: one pruning rule (with the default space's settings) over a table's rows."""
    if pruner not in ("pareto", "pareto-eager", "none"):
        raise UserInputError(f"unknown --pruner {pruner!r} for a replay; use pareto, pareto-eager or none")
    if not Path(path).is_file():
        raise UserInputError(f"bench table {str(path)!r} does not exist")
    table = Table.read(path)
    search = load_space().search
    settings = PrunerSettings(name=pruner, eta=search.prune_eta, epsilon=search.prune_epsilon,
                              warmup=search.prune_warmup, calibration_maps=search.prune_calibration_maps,
                              min_spearman=search.prune_min_spearman)
    result = replay_pruning(table, settings, order_seed)
    return {"table": str(path), "steps": table.steps, **result.to_dict()}


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

