"""What the default study's race costs at its most, and what cheaper races would decide: the issue-57 question
"can the README's run fit 15 minutes in its worst case?", answered from the committed truth tables (no training).

    python benchmarks/race_worst_case.py [--orders 10] [--pool 8] [--date 2026-12-06]
        [--rate-from benchmarks/data/default-run-f6fd82c-quiet-2026-12-05.json]

Two parts, one JSON (benchmarks/data/race-worst-case-DATE.json):
1. Cost. For each race setting, the default study's worst case (every contender to the pool's last seed, the
   equal-compute model at every seed of the best contender) from the dry run's own plan (commands/dryrun.race_plan),
   counted in steps and in layer-run steps (a deep12 step costs 12/8 of a plain one), and in minutes at the
   training rate a measured default run achieved (layer-run steps a second over its whole wall time, start-up and
   evaluations included).
2. What it decides. Each setting replayed over both truth tables (replays/policy.replay_race, --orders seed
   orders of a --pool seed pool) and judged at the table's longest length (4x, the default's target): maps claimed,
   claims wrong at 4x (a claimed map whose 12-seed mean at 4x is not below the baseline's), the regret of the
   reported best at 4x (in the table's seed sd there), and the race's compute. A race at 2x replays the table cut
   to its 1x and 2x lengths, and is still judged at 4x: does the cheaper verdict hold at the length the study asks
   about? Beside them, each map's mean paired difference to the baseline at 1x, 2x and 4x (12 seeds).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import statistics
import time
from pathlib import Path

from replays.policy import _claims_and_regret, race_template, replay_race
from replays.truth import TruthTable

from ilr_search.commands.dryrun import race_plan
from ilr_search.config import SearchConfig
from ilr_search.search.plan import plan_study
from ilr_search.space import load_space

ROOT = Path(__file__).resolve().parent.parent
TABLES = {"truth-small": ROOT / "benchmarks/data/truth-truth-small.parquet",
          "truth-nope": ROOT / "benchmarks/data/truth-truth-nope.parquet"}
# name -> (target factor, [search] changes)
SETTINGS: dict[str, tuple[int, dict]] = {
    "default (4x, 8 seeds, 3 contenders)": (4, {}),
    "4x, 6 seeds": (4, {"max_seeds": 6}),
    "4x, 5 seeds": (4, {"max_seeds": 5}),
    "4x, 8 seeds, 2 contenders": (4, {"race_contenders": 2}),
    "4x, 6 seeds, 2 contenders": (4, {"max_seeds": 6, "race_contenders": 2}),
    "4x, 5 seeds, 2 contenders": (4, {"max_seeds": 5, "race_contenders": 2}),
    "4x, screen 6": (4, {"race_screen": 6}),
    "2x, 8 seeds": (2, {}),
    "2x, 6 seeds": (2, {"max_seeds": 6}),
}


def cut(table: TruthTable, longest: int) -> TruthTable:
    """The table without its lengths above `longest`."""
    return dataclasses.replace(
        table,
        losses={k: v for k, v in table.losses.items() if k[1] <= longest},
        curves={k: v for k, v in table.curves.items() if k[1] <= longest},
    )


def worst_case(factor: int, changes: dict, rate: float) -> dict:
    """The default study's race at `factor` x with `changes`: least and most steps (race_plan) and the most in
    layer-run steps (the deep model's runs at its depth), and minutes at `rate` layer-run steps a second."""
    plan = plan_study(load_space(None, {"search": {"target": float(factor), **changes}}), "1.5x", None)
    race = race_plan(plan, plan.space.search.n_trials)
    shape = race.shape
    search = plan.space.search
    n_layers, most = plan.model.n_layers, plan.budget.max_layer_runs(plan.model)
    # in layer runs per step: every screened map but the baseline, and every recurrent contender, at the budget's
    # most (12 of 8 at 1.5x), the baseline at 8, the equal-compute model as deep as the best contender (12)
    screened = min(search.race_screen, search.n_trials)
    contenders = min(search.race_contenders, screened)
    deep = search.max_seeds if search.equal_compute == "depth" else 0
    layer_runs = (
        (screened - 1) * most + n_layers
        + (search.max_seeds - 1) * ((contenders - 1) * most + n_layers)
        + deep * most
    )
    most_layer_steps = layer_runs * race.target_steps / n_layers  # in plain-model steps
    trials = search.n_trials * plan.space.train.steps + 3 * plan.space.train.steps
    return {"target_steps": race.target_steps, "runs_min": race.runs_min, "runs_max": race.runs_max,
            "steps_min": race.steps_min, "steps_max": race.steps_max, "shape": str(shape),
            "trial_and_reference_steps": trials,
            "worst_minutes": (trials + most_layer_steps) / rate / 60}


def replays(table: TruthTable, factor: int, changes: dict, orders: int, pool: int) -> dict:
    longest = table.lengths[-1]
    at = cut(table, table.lengths[0] * factor) if table.lengths[0] * factor < longest else table
    race = race_template("race", **{k: v for k, v in changes.items() if k != "max_seeds"})
    n_seeds = changes.get("max_seeds", pool)
    rows = []
    for order in range(orders):
        r = replay_race(at, order, n_seeds, race)
        wrong, regret = _claims_and_regret(table, r.claimed, r.best, longest)
        rows.append({"order": order, "claimed": r.claimed, "wrong_at_4x": wrong, "best": r.best,
                     "regret_sd_at_4x": regret, "compute_steps": r.compute_steps, "unanswered": r.unanswered})
    regrets = [r["regret_sd_at_4x"] for r in rows if r["regret_sd_at_4x"] is not None]
    return {"rows": rows,
            "orders_claiming": sum(bool(r["claimed"]) for r in rows),
            "orders_wrong_at_4x": sum(bool(r["wrong_at_4x"]) for r in rows),
            "regret_within_1sd": sum(x <= 1 for x in regrets),
            "mean_regret_sd": statistics.fmean(regrets) if regrets else None,
            "max_regret_sd": max(regrets) if regrets else None,
            "mean_compute_steps": statistics.fmean(r["compute_steps"] for r in rows)}


def paired_by_length(table: TruthTable) -> dict[str, dict[int, tuple[float, float]]]:
    """Each map's mean paired loss difference to the baseline and its standard error, per length."""
    out: dict[str, dict[int, tuple[float, float]]] = {}
    for key in table.flops:
        out[key] = {}
        for steps in table.lengths:
            diffs = [v - b for (k, st, s), v in table.losses.items() if k == key and st == steps and v is not None
                     if (b := table.losses.get((table.baseline, steps, s))) is not None]
            if len(diffs) >= 2:
                out[key][steps] = (statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orders", type=int, default=10)
    ap.add_argument("--pool", type=int, default=SearchConfig().max_seeds)
    ap.add_argument("--date", default=time.strftime("%Y-%m-%d"))
    ap.add_argument("--rate-from", default=str(ROOT / "benchmarks/data/default-run-f6fd82c-quiet-2026-12-05.json"))
    args = ap.parse_args()

    measured = json.loads(Path(args.rate_from).read_text())
    # layer-run steps of that run: its trials' and references' steps, and its race runs' at their depth
    race_layer_steps = sum(r["steps"] * (int(r["map_key"][4:]) / 8 if r["map_key"].startswith("deep")
                                         else sum(int(x.rstrip("am")) for x in r["map_key"].split(",")) / 8)
                           for r in measured["race_runs"])
    trial_steps = measured["trial_steps"] + 3 * 500
    rate = (trial_steps + race_layer_steps) / measured["wall_seconds"]
    out = {"date": args.date, "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
           "rate": {"from": args.rate_from, "wall_seconds": measured["wall_seconds"],
                    "plain_equivalent_steps": trial_steps + race_layer_steps, "steps_per_second": rate},
           "settings": {}, "paired_by_length": {}}
    for name, path in TABLES.items():
        out["paired_by_length"][name] = paired_by_length(TruthTable.read(path))
    for setting, (factor, changes) in SETTINGS.items():
        entry = {"factor": factor, "changes": changes, "cost": worst_case(factor, changes, rate), "tables": {}}
        for name, path in TABLES.items():
            entry["tables"][name] = replays(TruthTable.read(path), factor, changes, args.orders, args.pool)
        out["settings"][setting] = entry
        t = entry["tables"]
        print(f"{setting:38s} worst {entry['cost']['worst_minutes']:5.1f} min | " + " | ".join(
            f"{n}: claim {v['orders_claiming']}/{args.orders}, wrong@4x {v['orders_wrong_at_4x']}, "
            f"regret<=1sd {v['regret_within_1sd']}, compute {v['mean_compute_steps']:.0f}" for n, v in t.items()))
    dest = ROOT / f"benchmarks/data/race-worst-case-{args.date}.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {dest.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
