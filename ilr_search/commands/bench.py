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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from ilr_search.config import PrunerSettings
from ilr_search.errors import UserInputError
from ilr_search.analysis.pareto import non_dominated
from ilr_search.analysis.racing import Evaluation, RaceSettings, benjamini_hochberg, race_state
from ilr_search.commands.report import _atomic_write, check_out_path
from ilr_search.analysis.results import curves_by_trial, references
from ilr_search.analysis.trials import trained_results
from ilr_search.search.maps import propose_map, seed_maps
from ilr_search.search.plan import plan_study
from ilr_search.search.progress import RunReporter
from ilr_search.search.pruners import verdict_at_rung
from ilr_search.search.run import RunRequest, run_study
from ilr_search.search.samplers import build_sampler, sampler_settings
from ilr_search.search.studies import open_study
from ilr_search.space import load_space
from ilr_search.analysis.stats import decision_level, paired_comparison
from ilr_search.storage import study_storage, CurvePoint, open_store, parse_storage


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
    run_study(RunRequest(space, budget, name, storage, n_trials=len(maps), sampler="random", pruner="none",
                         enqueue_maps=tuple(map(tuple, maps)), race=False), reporter)  # the table: every map once, no race
    seconds = time.perf_counter() - started
    rows = []
    study = open_study(parse_storage(storage), name)
    store = open_store(parse_storage(storage), name, read_only=True, storage=study_storage(study))
    curves = curves_by_trial(store.curve_points())
    for t in trained_results(study.get_trials(deepcopy=False)):
        rows.append({"reuse_map": ",".join(map(str, t.reuse_map)), "flops_ratio": t.flops_ratio,
                     "val_ppl": t.val_ppl, "val_bpb": t.val_bpb, "curve": json.dumps(sorted(curves[t.number].items())),
                     "steps": space.train.steps, "trial": t.number, "train_seconds": t.train_seconds})
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
    sampler_cfg = sampler_settings(sampler, seed, table.max_reuse)
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


def default_pruner_settings(pruner: str) -> PrunerSettings:
    """A pruning rule with the default space's settings (what a default study prunes with)."""
    search = load_space().search
    return PrunerSettings(name=pruner, eta=search.prune_eta, epsilon=search.prune_epsilon,
                          warmup=search.prune_warmup, calibration_maps=search.prune_calibration_maps,
                          min_spearman=search.prune_min_spearman)


def replay_table(path: str | Path, pruner: str = "pareto", order_seed: int | None = None) -> dict[str, Any]:
    """`ilr-search bench replay`: one pruning rule (with the default space's settings) over a table's rows."""
    if pruner not in ("pareto", "pareto-eager", "none"):
        raise UserInputError(f"unknown --pruner {pruner!r} for a replay; use pareto, pareto-eager or none")
    if not Path(path).is_file():
        raise UserInputError(f"bench table {str(path)!r} does not exist")
    table = Table.read(path)
    result = replay_pruning(table, default_pruner_settings(pruner), order_seed)
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


# ----------------------------------------------------------------------------------------------------
# Truth tables: maps at several lengths and seeds (benchmarks/truth.py), and the policies replayed over them

@dataclass(frozen=True)
class TruthTable:
    """One result per (map, steps, seed), as benchmarks/truth.py writes them (its docstring has the schema):
    val_loss None where the run diverged; curves (step -> val_loss) by (map, steps, seed)."""
    baseline: str
    flops: dict[str, float]
    losses: dict[tuple[str, int, int], float | None]
    curves: dict[tuple[str, int, int], dict[int, float]]
    n_layers: int
    max_reuse: int

    @classmethod
    def read(cls, path: str | Path) -> TruthTable:
        import pandas as pd

        if not Path(path).is_file():
            raise UserInputError(f"truth table {str(path)!r} does not exist")
        try:
            frame = pd.read_parquet(path) if str(path).endswith(".parquet") else pd.read_csv(path)
        except (OSError, ValueError) as e:
            raise UserInputError(f"cannot read truth table {str(path)!r}: {e}") from None
        missing = {"map_key", "flops_ratio", "steps", "seed", "val_loss"} - set(frame.columns)
        if missing or frame.empty:
            raise UserInputError(f"{str(path)!r} is not a truth table (benchmarks/truth.py writes one): "
                                 + (f"columns {sorted(missing)} missing" if missing else "no rows"))
        flops, losses, curves = {}, {}, {}
        for r in frame.to_dict("records"):
            key = (str(r["map_key"]), int(r["steps"]), int(r["seed"]))
            flops[key[0]] = float(r["flops_ratio"])
            loss = float(r["val_loss"])
            losses[key] = loss if math.isfinite(loss) else None
            if "curve" in r and isinstance(r["curve"], str):
                curves[key] = {int(st): float(v) for st, v in json.loads(r["curve"])}
        meta = json.loads(frame["meta"].iloc[0]) if "meta" in frame.columns else {}
        maps = [tuple(int(x) for x in k.split(",")) for k in flops]
        baseline = str(meta.get("baseline") or min(flops, key=lambda k: (flops[k], k)))
        return cls(baseline, flops, losses, curves, len(maps[0]), max(max(m) for m in maps))

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(sorted({steps for _, steps, _ in self.losses}))

    def seeds_at(self, steps: int) -> tuple[int, ...]:
        """The seeds every map has at `steps` (the seeds a replayed race can be answered at)."""
        per_map = [{s for (k, st, s) in self.losses if k == key and st == steps} for key in self.flops]
        return tuple(sorted(set.intersection(*per_map))) if per_map else ()

    def seed_mean(self, key: str, steps: int) -> float | None:
        """The table's truth for a map: its mean loss over every seed the table has at `steps`."""
        values = [v for (k, st, _), v in self.losses.items() if k == key and st == steps]
        if not values or any(v is None for v in values):
            return None
        return math.fsum(values) / len(values)

    def seed_sd(self, steps: int) -> float:
        """The pooled seed standard deviation of the loss at `steps` (root mean of the maps' variances)."""
        import statistics

        variances = []
        for key in self.flops:
            values = [v for (k, st, _), v in self.losses.items() if k == key and st == steps and v is not None]
            if len(values) >= 2:
                variances.append(statistics.variance(values))
        return math.sqrt(math.fsum(variances) / len(variances)) if variances else math.nan

    def evaluation(self, key: str, steps: int, seed: int) -> Evaluation | None:
        if (key, steps, seed) not in self.losses:
            return None
        return Evaluation(key, self.flops[key], steps, seed, self.losses[(key, steps, seed)])

    def bench_table(self, steps: int, seed: int) -> Table:
        """The maps at one length and seed as a bench table (for today's rule: one seed, pruned on its curve)."""
        rows = tuple(TableRow(k, tuple(int(x) for x in k.split(",")), self.flops[k],
                              math.exp(self.losses[(k, steps, seed)]), self.curves.get((k, steps, seed), {}))
                     for k in sorted(self.flops) if self.losses.get((k, steps, seed)) is not None)
        rungs = tuple(sorted({st for r in rows for st in r.curve if st < steps}))
        return Table(self.n_layers, self.max_reuse, max(sum(r.reuse_map or ()) for r in rows), steps, rungs, rows)


@dataclass
class PolicyReplay:
    """One replay of a policy over a truth table. claimed: the maps it reports as beating the baseline at the
    target; false_claims: those whose table seed mean at the target is not below the baseline's; best: the map
    it reports best, regret_sd: (its table mean loss at the target - the table's best) / the table's pooled
    seed sd there; intervals_held / intervals: its front intervals (>= 2 seeds) that hold the table's mean."""
    policy: str
    order_seed: int
    seeds: tuple[int, ...]
    compute_steps: int
    claimed: list[str]
    false_claims: list[str]
    best: str | None
    regret_sd: float | None
    intervals: int
    intervals_held: int
    verdict: str
    unanswered: list[tuple[str, int, int]]  # jobs the table could not answer (the replay stopped there)
    trained: list[tuple[str, int, int]] = field(default_factory=list)  # the race's results used, (map, steps, seed)


def _claims_and_regret(table: TruthTable, claimed: Sequence[str], best: str | None,
                       target: int) -> tuple[list[str], float | None]:
    base = table.seed_mean(table.baseline, target)
    false = [k for k in claimed if base is None or (table.seed_mean(k, target) or math.inf) >= base]
    means = [m for m in (table.seed_mean(k, target) for k in table.flops) if m is not None]
    regret = None
    sd = table.seed_sd(target)
    if best is not None and table.seed_mean(best, target) is not None and means and math.isfinite(sd) and sd > 0:
        regret = (table.seed_mean(best, target) - min(means)) / sd
    return false, regret


def replay_race(table: TruthTable, order_seed: int, n_seeds: int | None = None, confidence: float = 0.9,
                max_contenders: int = 6) -> PolicyReplay:
    """Run the racing policy with every job answered from the table: base length the table's shortest, target
    its longest, the race's seeds `n_seeds` of the table's target seeds in an order drawn from `order_seed`
    (the order decides which seed every map starts at and which seeds the race stops at)."""
    lengths = table.lengths
    available = list(table.seeds_at(lengths[-1]))
    random.Random(order_seed).shuffle(available)
    seeds = tuple(available[:n_seeds] if n_seeds else available)
    settings = RaceSettings(base_steps=lengths[0], target_steps=lengths[-1], seeds=seeds, confidence=confidence,
                            max_contenders=max_contenders)
    evaluations = [e for e in (table.evaluation(k, lengths[0], seeds[0]) for k in sorted(table.flops)) if e]
    unanswered: list[tuple[str, int, int]] = []
    while True:
        state = race_state(evaluations, settings, table.baseline)
        if state.done:
            break
        answers = [table.evaluation(j.map_key, j.steps, j.seed) for j in state.next_jobs]
        unanswered = [(j.map_key, j.steps, j.seed) for j, a in zip(state.next_jobs, answers) if a is None]
        if unanswered:
            break
        evaluations += [a for a in answers if a is not None]
    target = settings.target_steps
    claimed = list(state.confirmed_better)
    at_target = [p for p in state.front if p.steps == target]
    best = state.best
    false, regret = _claims_and_regret(table, claimed, best, target)
    held = [p for p in at_target if len(p.seeds) >= 2
            and p.interval[0] <= math.exp(table.seed_mean(p.map_key, target) or math.nan) <= p.interval[1]]
    return PolicyReplay("race", order_seed, seeds, sum(e.steps for e in evaluations), claimed, false, best, regret,
                        sum(len(p.seeds) >= 2 for p in at_target), len(held), state.verdict, unanswered,
                        [(e.map_key, e.steps, e.seed) for e in evaluations])


def replay_single_seed(table: TruthTable, order_seed: int, pruner: str) -> PolicyReplay:
    """Today's rule (pruner "pareto") or no pruning ("none"): every map once at the base length at one seed (drawn
    from `order_seed`), in a shuffled order, pruned at the rungs; the baseline at the other base seeds gives the
    noise band. It claims the recurrent maps on its front whose perplexity is below the baseline's by more than
    the band (today's front marks the rest as ties), and reports its best-perplexity map as best."""
    base = table.lengths[0]
    seeds = list(table.seeds_at(base))
    random.Random(order_seed).shuffle(seeds)
    bench = table.bench_table(base, seeds[0])
    result = replay_pruning(bench, default_pruner_settings(pruner), order_seed)
    pruned = {p["reuse_map"] for p in result.pruned}
    complete = [r for r in bench.rows if r.map_key not in pruned]
    band_ppls = [math.exp(v) for s in seeds for v in [table.losses.get((table.baseline, base, s))] if v is not None]
    spread = max(band_ppls) - min(band_ppls) if len(band_ppls) >= 2 else 0.0
    base_row = next((r for r in complete if r.map_key == table.baseline), None)
    front = [complete[i] for i in non_dominated([(r.val_ppl, r.flops_ratio) for r in complete])]
    claimed = sorted(r.map_key for r in front if base_row is not None and r.map_key != table.baseline
                     and r.val_ppl < base_row.val_ppl - spread)
    best = min(complete, key=lambda r: r.val_ppl).map_key if complete else None
    target = table.lengths[-1]
    false, regret = _claims_and_regret(table, claimed, best, target)
    compute = result.steps_trained + base * (len(band_ppls) - 1)
    verdict = (f"{len(claimed)} recurrent map(s) beat the baseline by more than its seed spread {spread:.3f} ppl at "
               f"{base} steps, one seed" if claimed else f"no recurrent map beat the baseline at {base} steps")
    return PolicyReplay("today" if pruner == "pareto" else "none", order_seed, (seeds[0],), compute, claimed, false,
                        best, regret, 0, 0, verdict, [])


POLICIES = ("race", "today", "none")


def table_decided_better(table: TruthTable, target: int, confidence: float) -> list[str]:
    """The maps the whole table shows better than the baseline at the target: the race's own test (paired t
    interval clear of zero, Benjamini-Hochberg over the maps) over every seed the table has."""
    def by_seed(key: str) -> dict[int, float]:
        return {s: v for (k, st, s), v in table.losses.items() if k == key and st == target and v is not None}

    keys = sorted(k for k in table.flops if k != table.baseline)
    tests = [paired_comparison(by_seed(k), by_seed(table.baseline), confidence) for k in keys]
    adjusted = benjamini_hochberg([t.p_value for t in tests])
    return [k for k, t, p in zip(keys, tests, adjusted) if t.n >= 2 and p < decision_level(confidence)]


def replay_policy(path: str | Path, policy: str, orders: int = 10, first_order: int = 0, n_seeds: int | None = None,
                  confidence: float = 0.9, max_contenders: int = 6) -> dict[str, Any]:
    """`ilr-search bench replay --policy`: a policy replayed over a truth table in `orders` orders, with the
    goals' figures: false confirmations (share of claimed maps that do not beat the baseline in the table's
    seed mean at the target), regret of the reported best in seed sd, and the coverage of the front's intervals."""
    if policy not in POLICIES:
        raise UserInputError(f"unknown --policy {policy!r}; use {', '.join(POLICIES)}")
    if orders < 1:
        raise UserInputError(f"--orders must be at least 1, got {orders}")
    if not 0 < confidence < 1:
        raise UserInputError(f"--confidence must be between 0 and 1, got {confidence}")
    if max_contenders < 1:
        raise UserInputError(f"--max-contenders must be at least 1, got {max_contenders}")
    table = TruthTable.read(path)
    if n_seeds is not None and not 1 <= n_seeds <= len(table.seeds_at(table.lengths[-1])):
        raise UserInputError(f"--race-seeds must be between 1 and the table's {len(table.seeds_at(table.lengths[-1]))} "
                             f"seeds at its longest length, got {n_seeds}")
    if len(table.lengths) < 2:
        raise UserInputError(f"truth table {str(path)!r} has one length ({table.lengths[0]} steps); a race needs two")
    runs = [replay_race(table, o, n_seeds, confidence, max_contenders) if policy == "race"
            else replay_single_seed(table, o, "pareto" if policy == "today" else "none")
            for o in range(first_order, first_order + orders)]
    target = table.lengths[-1]
    base_mean = table.seed_mean(table.baseline, target)
    truly_better = sorted(k for k in table.flops if k != table.baseline and base_mean is not None
                          and (table.seed_mean(k, target) or math.inf) < base_mean)
    decided = table_decided_better(table, target, confidence)
    claimed = sum(len(r.claimed) for r in runs)
    false = sum(len(r.false_claims) for r in runs)
    regrets = [r.regret_sd for r in runs if r.regret_sd is not None]
    intervals = sum(r.intervals for r in runs)
    import statistics

    return {
        "table": str(path), "policy": policy, "orders": orders, "base_steps": table.lengths[0], "target_steps": target,
        "table_seeds": list(table.seeds_at(target)), "maps": len(table.flops), "baseline": table.baseline,
        "confidence": confidence, "seed_sd_at_target": table.seed_sd(target),
        "table_better_than_baseline": truly_better, "table_decided_better": decided,
        "decided_claimed_share": (sum(len(set(r.claimed) & set(decided)) for r in runs) / (len(decided) * orders)
                                  if decided else None),
        "exhaustive_steps": sum(steps for (_, steps, _) in table.losses),
        "mean_compute_steps": statistics.fmean(r.compute_steps for r in runs),
        "maps_claimed": claimed, "false_claims": false, "false_claim_share": false / claimed if claimed else 0.0,
        "mean_regret_sd": statistics.fmean(regrets) if regrets else None,
        "max_regret_sd": max(regrets) if regrets else None,
        "regret_within_1sd_share": sum(r <= 1 for r in regrets) / len(regrets) if regrets else None,
        "intervals": intervals, "interval_coverage": sum(r.intervals_held for r in runs) / intervals if intervals else None,
        "replays": [dataclasses.asdict(r) for r in runs],
    }
